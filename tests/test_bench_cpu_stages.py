"""benchmarks/bench_cpu_stages.py is safe to start: its default writes a few layers, a shape that does not fit
the free space is refused before anything is written, and a stopped run leaves nothing behind."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest
from conftest import REPO

from truthflow.runlog import STOP_AT_ENV

BENCH = REPO / "benchmarks" / "bench_cpu_stages.py"
DEADLINE_S = 120  # for a fresh interpreter's imports on a loaded machine; the tests take seconds


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_cpu_stages", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_default_shape_is_refused_when_it_does_not_fit(tmp_path, monkeypatch):
    """No arguments: Llama-3-70B x PopQA at 4 of its 80 layers, stored in bfloat16 (2 bytes a value): resid
    files N x D x L x (2 + C) = 14,267 x 8,192 x 4 x 5 values and experiment files N x D x (2 + 1 + 2F) =
    14,267 x 8,192 x 7 (F = 2 factors), 3,155,632,128 values in all, or 6,311,264,256 bytes. With 1,000 bytes
    free the run stops in one line naming them, and writes nothing."""
    bench = load_bench()
    free = shutil.disk_usage(tmp_path)._replace(free=1_000)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: free)
    monkeypatch.setattr(sys, "argv", [str(BENCH), "--workdir", str(tmp_path)])
    with pytest.raises(SystemExit) as stop:
        bench.main()
    assert stop.value.code == (
        "bench_cpu_stages: llama-3-70b x popqa (N 14,267, D 8,192, 4 layers) needs 6,311,264,256 bytes of "
        f"states, and {tmp_path} has 1,000 bytes free: fewer --layers, or --workdir"
    )
    assert list(tmp_path.iterdir()) == []


def start_tiny(work, stop_at: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    if stop_at:
        env[STOP_AT_ENV] = stop_at
    command = [sys.executable, str(BENCH), "--shape", "tiny", "--workdir", str(work)]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_for(proc: subprocess.Popen, done) -> None:
    """Poll until done() holds, the process still running."""
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        assert time.monotonic() < deadline, "the bench never got there"
        time.sleep(0.05)


def stop(proc: subprocess.Popen, signum: int, work) -> None:
    """The signal, then: the run ends in one line and nothing is left under its folder."""
    try:
        proc.send_signal(signum)
        proc.send_signal(signal.SIGCONT)  # a run the test had paused takes the signal as it resumes
        _, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    name = signal.Signals(signum).name
    assert err.splitlines()[-1] == f"bench_cpu_stages: stopped by {name}; its temporary folder is removed", (
        err
    )
    assert proc.returncode == 1
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_run_stopped_mid_write_leaves_nothing(tmp_path, signum):
    """Paused after the second of tiny's four layers (STOP_AT_ENV), its resid files on disk and half written;
    then SIGTERM, or Ctrl-C's SIGINT."""
    proc = start_tiny(tmp_path, stop_at="wrote layer 2/4")
    wait_for(proc, lambda: psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED)
    assert {p.name for p in tmp_path.glob("*/resid_*.npy")} == {
        "resid_clean.npy",
        "resid_ko.npy",
        "resid_control.npy",
    }
    stop(proc, signum, tmp_path)


def test_a_run_stopped_while_it_measures_stops_its_stage_too(tmp_path):
    """SIGTERM once the run has started its first measured process (the reference fit, which reads the
    states): that process ends as well, and nothing is left."""
    proc = start_tiny(tmp_path)
    bench = psutil.Process(proc.pid)
    wait_for(proc, bench.children)
    children = bench.children(recursive=True)
    stop(proc, signal.SIGTERM, tmp_path)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
