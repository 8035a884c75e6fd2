"""How a local run shares its cores among model jobs. Imported by the Snakefile only (no rule's job imports
it), so editing it reruns nothing."""

from __future__ import annotations

from pathlib import Path


def model_slots(gpus: int | None, gpu_machine: bool) -> int:
    """How many model jobs a local run holds at once: one per GPU given with `--resources gpu=K`; one on a
    machine with a GPU but no such count (jobs that see one device would share it); else two, each on half
    of the cores, so that one job's single-threaded phases (loading, tokenizing, writing) overlap the other's
    forward passes. On 2 cores (SmolLM2, 32 x 60 tokens): one 2-thread pass 3.4 s, two 1-thread passes at
    once 6.2 and 6.5 s: no compute lost."""
    if gpus:
        return int(gpus)
    return 1 if gpu_machine else 2


def model_threads(cores: int | None, slots: int, default: int = 8) -> int:
    """Snakemake threads of a model job: its slot's share of a local run's --cores, or `default` where the
    run gives no core count (a cluster run: profiles set theirs with set-threads)."""
    if not cores:
        return default
    return max(1, -(-cores // max(1, slots)))


def torch_threads(threads: int, cores: int | None, cpus: int) -> int:
    """torch threads for a model job that holds `threads` of a local run's `cores`: the same share of the
    machine's `cpus`, never more than `threads` (two jobs with a thread per CPU each would both run ~10x
    slower); 0 where the run gives no core count (a cluster job: it uses its own `threads`)."""
    if not cores:
        return 0
    return max(1, min(threads, cpus * threads // cores))


def gpu_machine() -> bool:
    """Whether this machine has an NVIDIA GPU: a device node /dev/nvidia<N>, read without importing torch
    (the Snakefile asks at parse time)."""
    return any(Path("/dev").glob("nvidia[0-9]*"))
