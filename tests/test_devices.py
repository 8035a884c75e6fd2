"""GPU assignment without a GPU: simulated devices, concurrent claims from real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from truthflow import devices
from truthflow.devices import assign_devices, claim_devices, visible_devices
from truthflow.errors import TruthflowError

SRC = str(Path(__file__).resolve().parents[1] / "src")
# a model job: claim its GPUs (count simulated), hold them while "running", report what it got and when
JOB = """
import json, sys, time
from pathlib import Path
from truthflow.devices import assign_devices
n, count, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
lock_dir, out = sys.argv[4], sys.argv[5]
env = {"TRUTHFLOW_GPU_LOCK_DIR": lock_dir}
slot = assign_devices(n, env=env, count=count, poll_s=0.02)
t0 = time.time()
time.sleep(hold)
Path(out).write_text(json.dumps({"indices": slot.indices, "how": slot.how, "start": t0, "end": time.time()}))
"""


def _job(tmp_path: Path, name: str, n: int, count: int, hold: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))}
    for var in devices.SCHEDULER_ENVS + ("CUDA_VISIBLE_DEVICES", devices.ASSIGN_ENV):
        env.pop(var, None)
    args = [
        sys.executable,
        "-c",
        JOB,
        str(n),
        str(count),
        str(hold),
        str(tmp_path / "locks"),
        str(tmp_path / name),
    ]
    return subprocess.Popen(args, env=env)


@pytest.fixture(autouse=True)
def _release_held():
    yield
    for key in list(devices._HELD):
        devices.release(key)


def test_visible_devices():
    assert visible_devices({}, 3) == ["0", "1", "2"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "2,5"}, 2) == ["2", "5"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "GPU-aa, GPU-bb"}, 2) == ["GPU-aa", "GPU-bb"]


def test_no_gpu_means_cpu():
    assert assign_devices(1, env={}, count=0).device == "cpu"


def test_scheduler_devices_are_used_as_they_are(tmp_path):
    env = {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "3,4", devices.LOCK_DIR_ENV: str(tmp_path)}
    slot = assign_devices(2, env=env, count=2)
    assert (slot.device, slot.indices, slot.how) == ("cuda:0", [0, 1], "as-is")
    assert not list(tmp_path.iterdir())  # no lock taken
    # exactly the devices asked for: nothing to choose
    assert assign_devices(1, env={devices.LOCK_DIR_ENV: str(tmp_path)}, count=1).how == "as-is"
    assert assign_devices(1, env={devices.ASSIGN_ENV: "off"}, count=4).indices == [0]
    with pytest.raises(TruthflowError, match="TRUTHFLOW_GPU_ASSIGN"):
        assign_devices(1, env={devices.ASSIGN_ENV: "yes"}, count=4)


def test_one_process_reuses_its_claim(tmp_path):
    env = {devices.LOCK_DIR_ENV: str(tmp_path)}
    first = assign_devices(1, env=env, count=4)
    assert first.how == "lock" and first.device == "cuda:0"
    assert assign_devices(1, env=env, count=4).indices == first.indices  # a second model load in the job
    assert (tmp_path / "gpu-0.lock").read_text().strip() == str(os.getpid())


def test_claims_are_all_or_nothing(tmp_path, capsys):
    holder = _job(tmp_path, "holder", 1, 3, 60.0)  # another job holds GPU 0
    lock_dir = tmp_path / "locks"
    _wait_for_lock(lock_dir / "gpu-0.lock")
    with pytest.raises(TruthflowError, match="no 3 free GPU"):
        claim_devices(3, ["0", "1", "2"], lock_dir, poll_s=0.01, timeout_s=0.2)
    assert "waiting for 3 GPU(s)" in capsys.readouterr().err  # said at the first wait, not after a minute
    assert not devices._HELD  # the partial claim of 1 and 2 was given back, so no job can deadlock on it
    assert claim_devices(2, ["0", "1", "2"], lock_dir, poll_s=0.01, timeout_s=5) == [1, 2]
    holder.kill()
    holder.wait(timeout=10)


def _wait_for_lock(path: Path) -> None:
    deadline = time.time() + 30
    while not (path.exists() and path.read_text().strip()) and time.time() < deadline:
        time.sleep(0.05)
    assert path.read_text().strip(), f"{path} was never claimed"


def test_concurrent_jobs_get_their_own_gpus(tmp_path):
    """5 concurrent 1-GPU jobs on 3 (simulated) GPUs: never two on a device at once; 2 wait for a free one."""
    procs = [_job(tmp_path, f"job{i}", 1, 3, 1.0) for i in range(5)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    runs = [json.loads((tmp_path / f"job{i}").read_text()) for i in range(5)]
    assert all(r["how"] == "lock" and len(r["indices"]) == 1 for r in runs)
    assert {r["indices"][0] for r in runs} == {0, 1, 2}
    for dev in range(3):
        spans = sorted((r["start"], r["end"]) for r in runs if r["indices"] == [dev])
        overlaps = [(a, b) for a, b in zip(spans, spans[1:], strict=False) if a[1] > b[0]]
        assert not overlaps, f"GPU {dev} held by two jobs at once: {overlaps}"


def test_two_gpu_jobs_get_disjoint_pairs(tmp_path):
    procs = [_job(tmp_path, f"job{i}", 2, 4, 1.0) for i in range(2)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    a, b = (json.loads((tmp_path / f"job{i}").read_text()) for i in range(2))
    assert len(a["indices"]) == len(b["indices"]) == 2 and not set(a["indices"]) & set(b["indices"])


def test_a_killed_job_frees_its_gpu(tmp_path):
    holder = _job(tmp_path, "holder", 1, 2, 60.0)  # 2 devices, holds GPU 0 for a minute
    lock_dir = tmp_path / "locks"
    _wait_for_lock(lock_dir / "gpu-0.lock")
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    # both devices free again: the killed job's lock went with its process
    assert claim_devices(2, ["0", "1"], lock_dir, poll_s=0.01, timeout_s=5) == [0, 1]
