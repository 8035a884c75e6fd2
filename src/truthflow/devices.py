"""Which GPUs a model job runs on. One that sees exactly the GPUs it asked for (SLURM) uses them; one that
sees more (a local run with --resources gpu=K: all would load onto cuda:0) claims its own by an exclusive
flock per device, held until the process exits (even if SIGKILLed). TRUTHFLOW_GPU_ASSIGN = auto (lock if more
are visible than asked for) | lock | off; TRUTHFLOW_GPU_LOCK_DIR: the lock directory."""

import errno
import fcntl
import os
import re
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import TruthflowError

ASSIGN_ENV = "TRUTHFLOW_GPU_ASSIGN"
LOCK_DIR_ENV = "TRUTHFLOW_GPU_LOCK_DIR"
SCHEDULER_ENVS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID")
MODES = ("auto", "lock", "off")

# device key -> open lock file descriptor of this process (a second model load in the process reuses it)
_HELD: dict[str, int] = {}


@dataclass
class DeviceAssignment:
    device: str  # torch device of the model's first layer: "cuda:1", or "cpu"
    indices: list[int] = field(default_factory=list)  # torch CUDA indices the job may use
    how: str = "cpu"  # cpu | as-is | lock


def visible_devices(env: Mapping[str, str], count: int) -> list[str]:
    """Per visible device in torch order: its CUDA_VISIBLE_DEVICES entry (index or UUID), else its index."""
    if (listed := env.get("CUDA_VISIBLE_DEVICES")) is None:
        return [str(i) for i in range(count)]
    return [k.strip() for k in listed.split(",") if k.strip()][:count]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def default_lock_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    job = next((env[v] for v in SCHEDULER_ENVS if env.get(v)), None)
    suffix = f"-job-{_safe(job)}" if job else ""
    return Path(tempfile.gettempdir()) / f"truthflow-gpu-locks-{os.getuid()}{suffix}"


def _try_lock(lock_dir: Path, key: str) -> bool:
    fd = os.open(lock_dir / f"gpu-{_safe(key)}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return False
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for a person looking
    _HELD[key] = fd
    return True


def release(key: str) -> None:
    if (fd := _HELD.pop(key, None)) is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def claim_devices(
    n: int, keys: list[str], lock_dir: Path, poll_s: float = 2.0, timeout_s: float | None = None
) -> list[int]:
    """Torch indices of n of the devices `keys`, locked all or nothing (no deadlock; held ones reused)."""
    if n > len(keys):
        raise TruthflowError(f"a job asks for {n} GPUs but only {len(keys)} are visible")
    lock_dir.mkdir(parents=True, exist_ok=True)
    t0, last_log = time.monotonic(), float("-inf")  # the first wait is said at once, then once a minute
    while True:
        got, new = [i for i, k in enumerate(keys) if k in _HELD][:n], []
        for i, k in enumerate(keys):
            if len(got) + len(new) < n and k not in _HELD and _try_lock(lock_dir, k):
                new.append(i)
        if len(got) + len(new) == n:
            return sorted(got + new)
        for i in new:
            release(keys[i])
        now = time.monotonic()
        if timeout_s is not None and now - t0 > timeout_s:
            raise TruthflowError(
                f"no {n} free GPU(s) among {keys} after {timeout_s:.0f} s (locks in {lock_dir})"
            )
        if now - last_log > 60:
            print(f"waiting for {n} GPU(s) among {keys} (locks in {lock_dir})", file=sys.stderr, flush=True)
            last_log = now
        time.sleep(poll_s)


def assign_devices(
    n_gpus: int, env: Mapping[str, str] | None = None, count: int | None = None, poll_s: float = 2.0
) -> DeviceAssignment:
    """The devices of a job asking for n_gpus GPUs (at least one); count: CUDA devices (default: torch's)."""
    env = os.environ if env is None else env
    if count is None:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        return DeviceAssignment("cpu")
    keys = visible_devices(env, count) or [str(i) for i in range(count)]
    n = min(max(1, int(n_gpus)), len(keys))
    mode = env.get(ASSIGN_ENV, "auto")
    if mode not in MODES:
        raise TruthflowError(f"{ASSIGN_ENV}={mode!r} is not one of {', '.join(MODES)}")
    # a scheduler's job id says nothing about sharing: a local snakemake in a multi-GPU allocation shares them
    if mode == "off" or (mode == "auto" and len(keys) <= n):
        indices, how = list(range(n)), "as-is"
    else:
        lock_dir = Path(env.get(LOCK_DIR_ENV) or default_lock_dir(env))
        indices, how = claim_devices(n, keys, lock_dir, poll_s=poll_s), "lock"
    return DeviceAssignment(f"cuda:{indices[0]}", indices, how)
