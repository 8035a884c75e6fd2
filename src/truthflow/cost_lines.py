"""A line of the bill: what one stage of one model costs (`truthflow.pricing` prices the lines, the modules of
the other costs, `weights_cost` and `judge_cost`, add theirs), each figure measured or estimated with its
basis."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    value: float
    measured: bool
    basis: str

    def __add__(self, other: Figure) -> Figure:
        basis = self.basis if self.basis == other.basis else f"{self.basis}; {other.basis}"
        return Figure(self.value + other.value, self.measured and other.measured, basis)


@dataclass(frozen=True)
class Cost:
    """One stage of one model on one dataset (dataset "" for the model's weights)."""

    model: str
    dataset: str
    stage: str
    rule: str
    gpu_seconds: Figure | None = None  # GPU-seconds (wall seconds x the model's GPUs)
    cpu_seconds: Figure | None = None
    written: int = 0
    held: int = 0
    gpu_mem_gib: float | None = None
    ram_gib: Figure | None = None
    gpus: int = 1
    threads: int = 1  # an analysis job's workers (its rule's request)
    # answers priced as vLLM generates them: the engine's GPU-seconds for the same answers, for comparison
    engine_seconds: Figure | None = None
