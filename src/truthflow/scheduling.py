"""How a local run shares its cores among model jobs. Imported by the Snakefile only (no rule's job imports
it), so editing it reruns nothing."""

from __future__ import annotations

from pathlib import Path


def model_slots(gpus: int | None, gpu_machine: bool) -> int:
    """Model jobs a local run holds at once: one per GPU of `--resources gpu=K`; one on a machine with a GPU
    but no such count (they would share one device); else two, each on half of the cores, so that one job's
    single-threaded phases (loading, tokenizing, writing) overlap the other's forward passes."""
    return int(gpus) if gpus else (1 if gpu_machine else 2)


def model_threads(cores: int | None, slots: int, default: int = 8) -> int:
    """Snakemake threads of a model job: its slot's share of a local run's --cores, or `default` where the
    run gives no core count (a cluster run: profiles set theirs with set-threads)."""
    return max(1, -(-cores // max(1, slots))) if cores else default


def torch_threads(threads: int, cores: int | None, cpus: int) -> int:
    """torch threads for a model job that holds `threads` of a local run's `cores`: the same share of the
    machine's `cpus`, never more than `threads` (two jobs with a thread per CPU each would both run ~10x
    slower); 0 where the run gives no core count (a cluster job: it uses its own `threads`)."""
    return max(1, min(threads, cpus * threads // cores)) if cores else 0


def gpu_machine() -> bool:
    """Whether this machine has an NVIDIA GPU (a /dev/nvidia<N> node: no torch import at parse time)."""
    return any(Path("/dev").glob("nvidia[0-9]*"))
