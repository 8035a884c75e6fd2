"""How a local run shares its cores among model jobs; only the Snakefile imports it (edits rerun nothing)."""

from pathlib import Path


def model_slots(gpus: int | None, gpu_machine: bool) -> int:
    """Model jobs a local run holds at once: one per GPU of `--resources gpu=K`; one on a GPU machine without
    it; else two on half the cores each, so one's single-threaded phases overlap the other's passes."""
    return int(gpus) if gpus else (1 if gpu_machine else 2)


def model_threads(cores: int | None, slots: int, default: int = 8) -> int:
    """A model job's threads: its slot's share of --cores, else `default` (cluster profiles set theirs)."""
    return max(1, -(-cores // max(1, slots))) if cores else default


def torch_threads(threads: int, cores: int | None, cpus: int) -> int:
    """torch threads of a job holding `threads` of `cores`: that share of `cpus`, at most `threads` (two jobs
    of a thread per CPU each run ~10x slower); 0 without cores (a cluster job uses its threads)."""
    return max(1, min(threads, cpus * threads // cores)) if cores else 0


def gpu_machine() -> bool:
    """Whether this machine has an NVIDIA GPU (a /dev/nvidia<N> node: no torch import at parse time)."""
    return any(Path("/dev").glob("nvidia[0-9]*"))
