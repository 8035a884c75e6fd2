"""How a local run shares its cores among model jobs; only the Snakefile imports it (edits rerun nothing)."""

import os
from collections.abc import Mapping
from pathlib import Path


def model_slots(gpus: int) -> int:
    """Model jobs a local run holds at once: one per visible GPU; without one, two on half the cores each, so
    one's single-threaded phases overlap the other's passes."""
    return gpus if gpus > 0 else 2


def model_threads(cores: int | None, slots: int, default: int = 8) -> int:
    """A model job's threads: its slot's share of --cores, else `default` (cluster profiles set theirs)."""
    return max(1, -(-cores // max(1, slots))) if cores else default


def torch_threads(threads: int, cores: int | None, cpus: int) -> int:
    """torch threads of a job holding `threads` of `cores`: that share of `cpus`, at most `threads` (two jobs
    of a thread per CPU each run ~10x slower); 0 without cores (a cluster job uses its threads)."""
    return max(1, min(threads, cpus * threads // cores)) if cores else 0


def visible_gpus(environ: Mapping[str, str] = os.environ, dev: Path = Path("/dev")) -> int:
    """NVIDIA GPUs a job of this machine sees: its /dev/nvidia<N> nodes (no torch import at parse time), at
    most as many as CUDA_VISIBLE_DEVICES lists where it is set ("" hides them all)."""
    nodes = len(list(dev.glob("nvidia[0-9]*")))
    if (listed := environ.get("CUDA_VISIBLE_DEVICES")) is None:
        return nodes
    return min(nodes, len([key for key in listed.split(",") if key.strip()]))
