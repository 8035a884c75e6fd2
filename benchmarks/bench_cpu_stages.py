"""The CPU stages of a pathways run at the paper's shapes: synthetic residual states of a real model's shape
on a real dataset's row count, and the workflow's own scripts (probe_deltap, pathway_experiments,
pathways_tables, experiment_tables, plot_pathways) run on them as jobs run them.

    python benchmarks/bench_cpu_stages.py --shape llama-3-70b --dataset popqa --layers 4 --workers 1 2
    python benchmarks/bench_cpu_stages.py --shape tiny                       # seconds: what the test runs

Each stage runs its script file from workflow/scripts/ in a fresh process (one process per job, as Snakemake
starts it), with the `snakemake` object a job gets (inputs, outputs, params, threads), and is measured as
Snakemake's `benchmark:` measures a job: its process tree (the probe workers included) sampled every 0.2 s
for CPU-seconds and resident memory. The reference is one scikit-learn fit of the probe's size (StandardScaler
+ LogisticRegression on a training fold of one layer), in a fresh process too: probe_deltap makes
layers x seeds x folds such fits.

States: Gaussian [N, D] per layer with one planted direction (35% positives; probe AUCs of 0.7 to 0.9), a
knockout that turns the direction round for 40% of the samples (Question-Anchored), and controls that add
noise, stored as a paper model's states are (bfloat16). Disk: only `--layers` of the model's layers are
written (every row and hidden unit; default 4); the per-layer stages' figures are scaled to the model's layer
count (layers are fitted independently: time and CPU grow linearly in them), and the scaled figure is printed
beside the measured one. A shape whose states do not fit the free space of the folder is refused before
anything is written, and the temporary folder is removed however the run ends, SIGTERM and Ctrl-C included.
--record appends the measured rows to benchmarks/cpu_cost.tsv, which the bill (truthflow.pricing) and the
jobs' thread requests (truthflow.sizing) read.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from truthflow import registry, runlog  # noqa: E402
from truthflow.config import schema_defaults  # noqa: E402
from truthflow.pathways import activations  # noqa: E402
from truthflow.pathways.experiments import SCORES_SCHEMA  # noqa: E402
from truthflow.pathways.probes import n_folds  # noqa: E402

SCRIPTS = REPO / "workflow" / "scripts"
CPU_COST = REPO / "benchmarks" / "cpu_cost.tsv"
CPU_COST_COLUMNS = [
    "rule",
    "n",
    "layers",
    "hidden",
    "fits",
    "threads",
    "seconds",
    "cpu_seconds",
    "peak_rss_mb",
    "date",
    "machine",
]
# (layers, hidden) of the shapes the paper's CPU cost is dominated by; tiny runs in seconds (the test)
SHAPES = {"llama-3-70b": (80, 8192), "llama-3-8b": (32, 4096), "qwen3-32b": (64, 5120), "tiny": (6, 64)}
POSITIVE_SHARE = 0.35
Q_ANCHORED_SHARE = 0.4
SIGNAL = 1.0  # the planted direction's projection (noise: 1 per unit): probe AUCs of 0.7 to 0.9
SAMPLE_EVERY_S = 0.2
DEFAULT_LAYERS = 4  # resid files of 4.7 GB for Llama-3-70B x PopQA, where all 80 layers take 93.5 GB
# the dtype the paper's models compute in on GPUs: their state files' storage (activations.storage)
COMPUTE = "bfloat16"
STOPPED_WAIT_S = 10  # for a stopped run's stage processes to end before its folder is removed


# ---------------------------------------------------------------- synthetic inputs of one run
def state_bytes(n: int, layers: int, hidden: int, draws: int, factors: int) -> int:
    """Bytes of the state files a run writes: the resid files of `layers` layers and the experiment files."""
    shapes = [
        *activations.resid_shapes(n, layers, hidden, draws).values(),
        *activations.experiment_shapes(n, hidden, factors).values(),
    ]
    return sum(math.prod(shape) for shape in shapes) * activations.storage(COMPUTE).itemsize


def progress(line: str) -> None:
    """A progress line on stderr; a test stops the bench at the first line holding its STOP_AT_ENV text, as
    it stops a job (runlog.STOP_AT_ENV), once."""
    print(line, file=sys.stderr, flush=True)
    if (stop_at := os.environ.get(runlog.STOP_AT_ENV)) and stop_at in line:
        del os.environ[runlog.STOP_AT_ENV]
        os.kill(os.getpid(), signal.SIGSTOP)


def write_states(folder: Path, n: int, layers: int, hidden: int, draws: int, seed: int = 0) -> None:
    """samples.parquet and the resid files of one (model, dataset) run, as extract_pathways writes them."""
    rng = np.random.default_rng(seed)
    correct = rng.random(n) < POSITIVE_SHARE
    ids = [f"q{i}" for i in range(n)]
    # the columns the CPU stages read; the spans' columns are the layout of a short question
    samples = pl.DataFrame(
        {
            "id": ids,
            "correct": correct,
            "control_matched": np.ones(n, bool),
            "refusal": np.zeros(n, bool),
            "n_ea": rng.integers(1, 4, n),
            "n_eq": rng.integers(1, 4, n),
            "probe_position": rng.integers(20, 40, n),
            "question_positions": [list(range(5, 15))] * n,
        }
    )
    samples.write_parquet(folder / "samples.parquet")
    paths = {name: str(folder / f"{name}.npy") for name in activations.RESID}
    anchored = (rng.random(n) < Q_ANCHORED_SHARE).astype(np.float32)
    direction = rng.standard_normal(hidden).astype(np.float32)
    direction /= np.linalg.norm(direction)
    signal = np.outer(np.where(correct, 1.0, -1.0) * SIGNAL, direction).astype(np.float32)
    with activations.written(paths, activations.resid_shapes(n, layers, hidden, draws), COMPUTE) as resid:
        clean, kos = activations.knockout_out(*resid)
        for layer in range(layers):
            state = rng.standard_normal((n, hidden), dtype=np.float32) + signal * (0.5 + (layer + 1) / layers)
            clean[:, layer] = state
            # the target knockout turns the direction round for the Question-Anchored share, and leaves the
            # others' states: their probe's verdict flips, the others' does not
            kos[0][:, layer] = state - 2.0 * signal * anchored[:, None]
            for control in kos[1:]:
                control[:, layer] = state + 0.1 * rng.standard_normal((n, hidden), dtype=np.float32)
            progress(f"  wrote layer {layer + 1}/{layers}")


def write_experiment_inputs(folder: Path, n: int, hidden: int, factors: int, k_layer: int) -> None:
    """What extract_experiments and download_dataset give pathway_experiments: scores, states at K, data."""
    rng = np.random.default_rng(1)
    shapes = activations.experiment_shapes(n, hidden, factors)
    paths = {name: str(folder / f"exp_{name}.npy") for name in activations.EXPERIMENT}
    clean = activations.read_resid(
        {"resid_clean": str(folder / "resid_clean.npy")}, n, "samples", ["resid_clean"]
    )[0]
    at_k = np.asarray(clean[:, k_layer - 1], dtype=np.float32)
    with activations.written(paths, shapes, COMPUTE) as (patch, answer_only, pr):
        patch[:] = at_k + 0.1 * rng.standard_normal((2, n, hidden), dtype=np.float32)
        answer_only[:] = at_k + 0.2 * rng.standard_normal((n, hidden), dtype=np.float32)
        pr[:] = at_k * np.linspace(0.5, 2.0, 2 * factors, dtype=np.float32)[:, None, None]
    ids = pl.read_parquet(folder / "samples.parquet")["id"]
    scores = {
        "id": ids,
        "layer": [k_layer] * n,
        "donor": ids.shift(1).fill_null("q1"),
        "donor_length_matched": [True] * n,
        "patch_control_matched": [True] * n,
        "p_true": rng.random(n),
        "logit_mean": rng.standard_normal(n),
        "logit_min": rng.standard_normal(n),
        "s_eq_ea": [[float(v)] * 3 for v in rng.random(n)],
        "s_eq_all": [[float(v)] * 3 for v in rng.random(n)],
    }
    pl.DataFrame(scores, schema=SCORES_SCHEMA).write_parquet(folder / "exp_scores.parquet")
    pl.DataFrame({"id": ids, "dataset": ["popqa"] * n}).write_parquet(folder / "data.parquet")


# ---------------------------------------------------------------- the stages, as jobs
def stage_jobs(folder: Path, model: str, dataset: str, workers: int) -> dict[str, dict]:
    """Each stage's script and the `snakemake` object its job gets (inputs, outputs, params, threads)."""
    pw = {
        k: schema_defaults("pathways", k) for k in ("probe", "bootstrap", "check", "experiments", "knockout")
    }
    probe_cfg = {
        "probe": pw["probe"],
        "anchor_split": "per_layer",
        "fixed_layer": None,
        "bootstrap": pw["bootstrap"],
        "check": pw["check"],
    }
    resid = {name: str(folder / f"{name}.npy") for name in activations.RESID}
    run = lambda name: str(folder / name)  # noqa: E731 - a path of this run's folder
    probe_out = {k: run(f"{k}.parquet") for k in ("auc", "deltap", "summary", "check")}
    exp_out = {k: run(f"out_{k}.parquet") for k in ("rows", "awareness", "detection", "per_sample")}
    tables = folder / "tables"
    tables.mkdir(exist_ok=True)
    captions = {f"{f}_caption": str(REPO / "workflow" / "report" / f"{f}.rst") for f in PATHWAYS_FIGURES}
    figures = {}
    for fig in PATHWAYS_FIGURES:
        figures[f"{fig}_png"] = str(tables / f"{fig}.png")
        figures[f"{fig}_pdf"] = str(tables / f"{fig}.pdf")
    pathways_tables_out = {
        "summary": "pathways_summary.parquet",
        "check": "pathways_check.parquet",
        "check_tsv": "pathways_check.tsv",
        "check_layers": "pathways_check_layers.tsv",
        "exact_tokens": "exact_tokens.tsv",
        "auc": "probe_auc.parquet",
        "auc_tsv": "probe_auc.tsv",
        "dropped": "dropped_samples.tsv",
    }
    experiment_tables_out = {
        "rows": "pathways_experiments.parquet",
        "rows_tsv": "pathways_experiments.tsv",
        "awareness": "pathways_awareness.parquet",
        "awareness_tsv": "pathways_awareness.tsv",
        "detection": "pathways_detection.parquet",
        "table3": "pathways_table3.tsv",
        "per_sample": "pathways_experiment_samples.parquet",
    }
    return {
        "probe_deltap": dict(
            input={"samples": run("samples.parquet"), **resid},
            output={**probe_out, "settings": run("probe_settings.json")},
            params={"cfg": probe_cfg},
            threads=workers,
        ),
        "pathway_experiments": dict(
            input={
                "patch": run("exp_patch.npy"),
                "answer_only": run("exp_answer_only.npy"),
                "pr": run("exp_pr.npy"),
                "scores": run("exp_scores.parquet"),
                "samples": run("samples.parquet"),
                "deltap": probe_out["deltap"],
                "resid_clean": resid["resid_clean"],
                "data": run("data.parquet"),
            },
            output={**exp_out, "settings": run("experiments_settings.json")},
            params={"experiments": pw["experiments"], "probe": pw["probe"], "bootstrap": pw["bootstrap"]},
            threads=workers,
        ),
        "pathways_tables": dict(
            input={
                "summary": [probe_out["summary"]],
                "auc": [probe_out["auc"]],
                "dropped": [run("dropped.parquet")],
                "samples": [run("samples.parquet")],
                "check": [probe_out["check"]],
                "data_dropped": [],
            },
            output={k: str(tables / v) for k, v in pathways_tables_out.items()},
            params={"runs": [(model, dataset)], "check": pw["check"]},
            threads=1,
        ),
        "experiment_tables": dict(
            input={k: [v] for k, v in exp_out.items()},
            output={k: str(tables / v) for k, v in experiment_tables_out.items()},
            params={},
            threads=1,
        ),
        "plot_pathways": dict(
            input={
                **captions,
                "summary": str(tables / "pathways_summary.parquet"),
                "auc": str(tables / "probe_auc.parquet"),
                "check": str(tables / "pathways_check.parquet"),
            },
            output=figures,
            params={
                "models": [model, model],
                "titles": {model: model},
                "caption": "synthetic states",
                "show_caption": True,
                "target": pw["knockout"]["target"],
                "check": pw["check"],
            },
            threads=1,
        ),
    }


PATHWAYS_FIGURES = ("pathways", "probe_auc", "pathways_control", "pathways_check")
# the stages that take threads (workers fitting layers side by side); only probe_deltap's time is all per
# layer: pathway_experiments' layer-K fits (patching, answer-only, Table 3's MoP and PR) do not grow with L
PER_LAYER_STAGES = ("probe_deltap", "pathway_experiments")
SCALED_STAGES = ("probe_deltap",)


def run_stage_here(spec_file: str) -> None:
    """In the stage's own process: run its script with the `snakemake` object a job gets."""
    import runpy

    from snakemake.iocontainers import Namedlist

    spec = json.loads(Path(spec_file).read_text())
    sm = type("Snakemake", (), {})()
    for key in ("input", "output", "params"):
        setattr(sm, key, Namedlist(fromdict=spec[key]))
    sm.wildcards = Namedlist(fromdict={"model": spec["model"], "dataset": spec["dataset"]})
    sm.log, sm.threads, sm.rule = Namedlist(), spec["threads"], spec["rule"]
    runpy.run_path(str(SCRIPTS / f"{spec['rule']}.py"), init_globals={"snakemake": sm}, run_name="__main__")


def measure(command: list[str], env: dict | None = None, capture: bool = False) -> dict:
    """Wall seconds, CPU-seconds and peak resident MiB of a command's process tree, sampled as Snakemake's
    benchmark samples a job (here every SAMPLE_EVERY_S s): each process's last CPU time counts."""
    t0 = time.perf_counter()
    proc = psutil.Popen(command, env=env, stdout=subprocess.PIPE if capture else None, text=True)
    cpu_by_pid: dict[int, float] = {}
    peak_rss = 0
    try:
        while proc.poll() is None:
            try:
                tree = [proc, *proc.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            rss = 0
            for p in tree:
                try:
                    times = p.cpu_times()
                    cpu_by_pid[p.pid] = times.user + times.system
                    rss += p.memory_info().rss
                except psutil.NoSuchProcess:
                    continue
            peak_rss = max(peak_rss, rss)
            time.sleep(SAMPLE_EVERY_S)
    finally:
        if proc.poll() is None:  # the bench was stopped: its stage stops too, before the folder is removed
            stop_tree(proc)
    if proc.returncode:
        sys.exit(f"{' '.join(command[-2:])} failed with exit code {proc.returncode}")
    stdout = proc.stdout.read() if capture else ""
    return {
        "stdout": stdout,
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": sum(cpu_by_pid.values()),
        "peak_rss_mb": peak_rss / 2**20,
    }


def stop_tree(proc: psutil.Process) -> None:
    """SIGTERM to a process and its descendants (a stage's probe workers), SIGKILL to any still there after
    STOPPED_WAIT_S: none of them writes into the folder once it is removed."""
    tree = [proc]
    with contextlib.suppress(psutil.NoSuchProcess):
        tree += proc.children(recursive=True)
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    for p in psutil.wait_procs(tree, timeout=STOPPED_WAIT_S)[1]:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(tree, timeout=STOPPED_WAIT_S)


def run_stage(rule: str, job: dict, folder: Path, model: str, dataset: str) -> dict[str, float]:
    spec = {**job, "rule": rule, "model": model, "dataset": dataset}
    spec_file = folder / f"{rule}.job.json"
    spec_file.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    got = measure([sys.executable, __file__, "--run-stage", str(spec_file)], env)
    got.pop("stdout")
    return got


REFERENCE = """
import sys, time
import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler
path, layer, n_train = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
C, max_iter = float(sys.argv[4]), int(sys.argv[5])
stored = np.load(path, mmap_mode="r")
import polars as pl
y = pl.read_parquet(sys.argv[6])["correct"].to_numpy().astype(int)[:n_train]
x = np.asarray(stored[layer, :n_train], dtype=np.float32)
wall, cpu = time.perf_counter(), time.process_time()
scaler = StandardScaler().fit(x)
LogisticRegression(C=C, max_iter=max_iter).fit(scaler.transform(x), y)
print(time.perf_counter() - wall, time.process_time() - cpu)
"""


def reference_fit(folder: Path, n: int, probe: dict) -> dict[str, float]:
    """One probe fit of the job's size (a training fold of one layer) in its own process, imports included."""
    n_train = n - n // n_folds(probe["test_size"])
    command = [
        sys.executable,
        "-c",
        REFERENCE,
        str(folder / "resid_clean.npy"),
        "0",
        str(n_train),
        str(probe["C"]),
        str(probe["max_iter"]),
        str(folder / "samples.parquet"),
    ]
    got = measure(command, capture=True)
    fit_seconds, fit_cpu = (float(v) for v in got.pop("stdout").split())
    return {**got, "fit_seconds": fit_seconds, "fit_cpu_seconds": fit_cpu}


def machine() -> str:
    load = os.getloadavg()[0]
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {load:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-3-70b")
    ap.add_argument("--dataset", choices=registry.qa_names(), default="popqa")
    ap.add_argument("--n", type=int, help="rows (default: the dataset's; tiny: 60)")
    ap.add_argument(
        "--layers",
        type=int,
        default=DEFAULT_LAYERS,
        help=f"layers written and fitted (default: {DEFAULT_LAYERS}; the figures scale to all)",
    )
    ap.add_argument("--workers", type=int, nargs="+", default=[1], help="threads of the per-layer stages")
    ap.add_argument(
        "--workdir", help="where the temporary folder of the synthetic states goes (default: TMPDIR)"
    )
    ap.add_argument("--record", action="store_true", help="append the measured rows to cpu_cost.tsv")
    ap.add_argument("--run-stage", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run_stage:
        return run_stage_here(args.run_stage)
    model_layers, hidden = SHAPES[args.shape]
    n = args.n or (60 if args.shape == "tiny" else registry.hub_rows(args.dataset))
    layers = min(args.layers, model_layers)
    scale = model_layers / layers
    probe = schema_defaults("pathways", "probe")
    fits = len(probe["seeds"]) * n_folds(probe["test_size"])
    draws = schema_defaults("pathways", "knockout")["control_draws"]
    factors = len(schema_defaults("pathways", "experiments")["pr_factors"])
    where = args.workdir or tempfile.gettempdir()
    size = state_bytes(n, layers, hidden, draws, factors)
    free = shutil.disk_usage(where).free
    if size > free:
        sys.exit(
            f"bench_cpu_stages: {args.shape} x {args.dataset} (N {n:,}, D {hidden:,}, {layers} layers) needs "
            f"{size:,} bytes of states, and {where} has {free:,} bytes free: fewer --layers, or --workdir"
        )
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        folder = Path(tmp)
        print(f"{args.shape} x {args.dataset}: N {n:,}, D {hidden:,}, {layers} of {model_layers} layers")
        print(f"writing synthetic states ({size / 1e9:.1f} GB, layer-major) in {folder} ...", flush=True)
        write_states(folder, n, layers, hidden, draws)
        pl.DataFrame(schema={"model": pl.String, "dataset": pl.String, "reason": pl.String}).write_parquet(
            folder / "dropped.parquet"
        )
        rows = []
        ref = reference_fit(folder, n, probe)
        shape = f"{n - n // 5:,} x {hidden:,}"
        print(
            f"reference: one scikit-learn fit (StandardScaler + LogisticRegression, {shape}): "
            f"{ref['fit_seconds']:.2f} s, {ref['fit_cpu_seconds']:.2f} CPU-s "
            f"(its process: {ref['seconds']:.1f} s, peak {ref['peak_rss_mb']:,.0f} MiB)"
        )
        for workers in args.workers:
            jobs = stage_jobs(folder, args.shape, args.dataset, workers)
            for rule, job in jobs.items():
                if rule not in PER_LAYER_STAGES and workers != args.workers[-1]:
                    continue  # the tables and plots read small tables and run one thread: timed once
                if rule == "pathway_experiments":
                    k_layer = int(pl.read_parquet(folder / "auc.parquet")["layer"].max() // 2 or 1)
                    write_experiment_inputs(folder, n, hidden, factors, k_layer)
                got = run_stage(rule, job, folder, args.shape, args.dataset)
                threads = job["threads"]
                per_layer = rule in SCALED_STAGES
                factor = scale if per_layer else 1.0
                fit_share = ""
                if rule == "probe_deltap":
                    ref_cpu = ref["fit_cpu_seconds"] * layers * fits
                    fit_share = f"; {layers} layers x {fits} reference fits: {ref_cpu:,.0f} CPU-s"
                print(
                    f"{rule:<20} threads {threads}: {got['seconds']:8.1f} s, "
                    f"{got['cpu_seconds']:8.1f} CPU-s, "
                    f"peak {got['peak_rss_mb']:7,.0f} MiB"
                    + (
                        f"  -> all {model_layers} layers: {got['seconds'] * factor / 60:6.1f} min, "
                        f"{got['cpu_seconds'] * factor / 3600:5.2f} CPU-h"
                        if per_layer and scale != 1
                        else ""
                    )
                    + fit_share,
                    flush=True,
                )
                rows.append(
                    {
                        "rule": rule,
                        "n": n,
                        "layers": layers,
                        "hidden": hidden,
                        "fits": fits,
                        "threads": threads,
                        "seconds": round(got["seconds"], 1),
                        "cpu_seconds": round(got["cpu_seconds"], 1),
                        "peak_rss_mb": round(got["peak_rss_mb"]),
                        "date": datetime.date.today().isoformat(),
                        "machine": machine(),
                    }
                )
        if args.record:
            new = not CPU_COST.exists()
            with CPU_COST.open("a") as handle:
                if new:
                    handle.write("\t".join(CPU_COST_COLUMNS) + "\n")
                for row in rows:
                    handle.write("\t".join(str(row[c]) for c in CPU_COST_COLUMNS) + "\n")
            print(f"recorded {len(rows)} rows in {CPU_COST.relative_to(REPO)}")


if __name__ == "__main__":
    # SIGTERM raised as Ctrl-C's SIGINT is: either unwinds the stack, so the stage running is stopped
    # (`measure`) and the TemporaryDirectory removed
    signal.signal(signal.SIGTERM, runlog.raise_interrupt)
    try:
        main()
    except KeyboardInterrupt as exc:
        signum = signal.Signals(exc.args[0] if exc.args else signal.SIGINT)
        sys.exit(f"bench_cpu_stages: stopped by {signum.name}; its temporary folder is removed")
