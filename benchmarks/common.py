"""Helpers shared by the benchmark scripts."""

from __future__ import annotations

import resource

import torch


def peak_mb() -> float:
    """Peak GPU memory allocated (CUDA) or peak resident memory of this process (CPU), in MiB."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
