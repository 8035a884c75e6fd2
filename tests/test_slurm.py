"""The demo config through a real SLURM cluster (the slurm executor plugin, profiles/slurm-ci): jobs show in
squeue, GPU rules run unmodified on the node's fake GPU gres, and the tables equal those of the local run.
Runs where a cluster is up (.ci/run starts one in CI); skipped elsewhere."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time

import numpy as np
import polars as pl
import pytest
from conftest import REPO, new_workdir, snakemake


def slurm_up() -> bool:
    if not shutil.which("sinfo"):
        return False
    out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
    return out.returncode == 0 and "idle" in out.stdout.split()


pytestmark = [pytest.mark.slow, pytest.mark.skipif(not slurm_up(), reason="no SLURM cluster is up")]


def _watch_squeue(seen: set[str], stop: threading.Event) -> None:
    while not stop.is_set():
        out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True, timeout=20)
        seen.update(line for line in out.stdout.splitlines() if line.strip())
        time.sleep(1)


def _frames_equal(a: pl.DataFrame, b: pl.DataFrame, keys: list[str]) -> None:
    a, b = a.sort(keys), b.sort(keys)
    assert a.columns == b.columns and a.height == b.height
    for col in a.columns:
        if a[col].dtype.is_float():
            assert np.allclose(a[col].to_numpy(), b[col].to_numpy(), equal_nan=True, atol=1e-6), col
        else:
            assert a[col].to_list() == b[col].to_list(), col


def test_demo_config_through_slurm_equals_local(demo_run, tmp_path, demo_models_root):
    workdir = new_workdir(tmp_path, demo_models_root)
    seen: set[str] = set()
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_squeue, args=(seen, stop), daemon=True)
    watcher.start()
    try:
        proc = snakemake(workdir, "--profile", str(REPO / "profiles" / "slurm-ci"), timeout=2400)
    finally:
        stop.set()
        watcher.join(timeout=30)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    assert seen, "no job ever showed in squeue"
    print("\n".join(sorted(seen)))
    local, remote = demo_run / "results" / "demo" / "tables", workdir / "results" / "demo" / "tables"
    _frames_equal(
        pl.read_csv(local / "accuracy.tsv", separator="\t"),
        pl.read_csv(remote / "accuracy.tsv", separator="\t"),
        ["model", "dataset"],
    )
    _frames_equal(
        pl.read_parquet(local / "pathways_summary.parquet"),
        pl.read_parquet(remote / "pathways_summary.parquet"),
        ["model", "dataset", "knockout", "anchor", "layer"],
    )
    _frames_equal(
        pl.read_parquet(local / "pathways_check.parquet"),
        pl.read_parquet(remote / "pathways_check.parquet"),
        ["model", "dataset"],
    )
    _frames_equal(
        pl.read_parquet(local / "probe_auc.parquet"),
        pl.read_parquet(remote / "probe_auc.parquet"),
        ["model", "dataset", "seed", "layer"],
    )
    _frames_equal(
        pl.read_parquet(local / "depth_per_question.parquet"),
        pl.read_parquet(remote / "depth_per_question.parquet"),
        ["model", "qid"],
    )
