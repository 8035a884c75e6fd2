"""Helpers shared by the benchmark scripts."""

from __future__ import annotations

import resource

import torch


def peak_mb() -> float:
    """Peak GPU memory allocated (CUDA) or peak resident memory of this process (CPU), in MiB."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_models(shape: str | None, names: list[str]):
    """(LoadedModel, label) of each model a benchmark runs: random weights of `shape` (shapes.py), or else the
    demo's prepared models (resources/models/<name>, float32)."""
    if shape:
        from shapes import random_model

        yield random_model(shape), f"{shape} (random weights, bf16, sdpa)"
        return
    from pathlib import Path

    from truthflow.models import load_model

    for name in names:
        yield load_model(Path("resources/models") / name, "float32"), f"{name} (cpu, fp32)"


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
