"""Loading and hashing model weights, priced (`truthflow.pricing.price` adds the lines). prepare_model hashes
every file of a hub snapshot with sha256 (`hub.sha256_of`, one thread; the digests go in the snapshot's info
file): CPU-seconds of its weights' bytes at the cold sha256 rate. Every model job reads its model's weights
before its first batch: GPU-seconds (the job holds its GPUs meanwhile) of the weights' bytes at the cold read
rate, an estimate (the rate of one disk: a cluster's filesystem reads at its own). Both rates:
benchmarks/hash_rate.tsv (benchmarks/bench_hash.py: one file, its pages dropped from the page cache first)."""

from __future__ import annotations

from pathlib import Path

from . import diskplan, sizing
from .cost_lines import Cost, Figure

HASH_RATES = Path(__file__).resolve().parents[2] / "benchmarks" / "hash_rate.tsv"
HASH_COLUMNS = ["what", "mb", "seconds", "mb_per_s", "machine", "date"]


def rates(path: Path = HASH_RATES) -> dict[str, tuple[float, str]]:
    """what -> (bytes per second, where and when measured)."""
    return {
        r["what"]: (float(r["mb_per_s"]) * 1e6, f"{r['machine']}, {r['date']}")
        for r in sizing.read_rows(path, HASH_COLUMNS)
    }


def hash_seconds(spec: dict, size: int, measured: dict[str, tuple[float, str]]) -> Figure | None:
    """prepare_model's sha256 of a model's weights: a hub snapshot's only (no other source is hashed)."""
    if "hub" not in spec["source"] or not size or "sha256 cold" not in measured:
        return None
    rate, where = measured["sha256 cold"]
    text = f"sha256 of the weights at {rate / 1e6:,.0f} MB/s, one thread (bench_hash.py: {where})"
    return Figure(size / rate, True, text)


def weights_line(
    name: str,
    spec: dict,
    size: int,
    measured: dict[str, tuple[float, str]],
    stage: str = "weights",
    rule: str = "prepare_model",
) -> Cost:
    """A model's `size` bytes of weights, written by `rule` and held to the end; CPU-seconds of their sha256
    where the rule is prepare_model, which hashes what it fetches (`hash_seconds`)."""
    hashed = hash_seconds(spec, size, measured) if rule == "prepare_model" else None
    return Cost(name, "", stage, rule, cpu_seconds=hashed, written=size, held=size)


def load_seconds(size: int, gpus: int, measured: dict[str, tuple[float, str]]) -> Figure | None:
    """GPU-seconds of one job's read of `size` bytes of weights on `gpus` GPUs."""
    if not size or "read cold" not in measured:
        return None
    rate, where = measured["read cold"]
    text = (
        f"weights read at {rate / 1e6:,.0f} MB/s, a cold read (bench_hash.py: {where}); a cluster's differs"
    )
    return Figure(size / rate * gpus, False, text)


def load_costs(
    config: dict, costs: list[Cost], measured: dict[str, tuple[float, str]] | None = None
) -> list[Cost]:
    """A load line for every model job among `costs` (one per rule, model and dataset with GPU-seconds), under
    the job's key, so `pricing.durations` counts it in the job's wall time."""
    measured = rates() if measured is None else measured
    jobs = {(c.rule, c.model, c.dataset): c for c in costs if c.gpu_seconds}
    out = []
    for c in jobs.values():
        size = diskplan.weights_bytes(c.model, config["models"][c.model])
        if seconds := load_seconds(size, c.gpus, measured):
            out.append(Cost(c.model, c.dataset, "load weights", c.rule, gpu_seconds=seconds, gpus=c.gpus))
    return out
