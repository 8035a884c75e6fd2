"""What generating answers costs on a GPU, priced before a run (`truthflow.pricing` prices a run's answers
with it, and `truthflow.judge_cost` an hf judge's verdicts).

A decode step reads the weights and every row's KV cache; the step's seconds per byte are calibrated on the
shape's measured answers row (`step_cost`), and the answers of a run are priced step by step at the context
each step reaches (prompt + up to max_new_tokens, every answer running to the cap: an upper bound) and at the
batch the model's batch_size and token budget give (`decode_batch`)."""

from __future__ import annotations

import re

from .memplan import BYTES, Dims

# prompt tokens of a question (a chat template adds CHAT_TOKENS); issue 32's answers rows: prompts 16-256
CHAT_TOKENS = 40
BENCH_JOB_PROMPT = 16  # bench_job.py's questions: 6-20 one-id words between BOS, "Q:" and "A:"


def kv_bytes(d: Dims, dtype: str) -> int:
    """KV-cache bytes of one token over all layers."""
    return 2 * d.layers * d.kv_heads * d.head_dim * BYTES.get(dtype, 2)


def decode_work(d: Dims, dtype: str, batch: int, prompt: float, new: int) -> float:
    """Bytes read per answer over its `new` decode steps at `batch` rows: each step reads the weights (shared
    by the batch) and the row's KV cache of prompt + s tokens: new W / batch + kv (new p + new (new + 1) / 2).
    """
    weights = d.params * BYTES.get(dtype, 2)
    return new * weights / batch + kv_bytes(d, dtype) * (new * prompt + new * (new + 1) / 2)


def decode_batch(batch_size: int, token_budget: int, prompt: float, new: int) -> int:
    """Rows of a generation batch: batch_size, or fewer where rows x (prompt + new) exceeds the budget."""
    return max(1, min(batch_size, int(token_budget // (prompt + new))))


def measured_decode(row: dict) -> tuple[int, float, int]:
    """(batch, mean prompt tokens, new tokens) of a measured answers row, from its settings."""
    settings = row.get("settings", "")
    batch = int(m.group(1)) if (m := re.search(r"batch (\d+)", settings)) else 1
    budget = int(m.group(1)) if (m := re.search(r"token budget (\d+)", settings)) else 32_768
    got = re.search(r"prompts (\d+)-(\d+) tokens", settings)
    prompt = (int(got.group(1)) + int(got.group(2))) / 2 if got else BENCH_JOB_PROMPT
    new = row["max_new_tokens"]
    return decode_batch(batch, budget, prompt, new), prompt, new


def step_cost(rows: list[tuple[Dims, dict]]) -> tuple[float, float]:
    """(seconds per decode step, seconds per byte read) fitted on measured answers rows (least squares over
    their mean step time against the bytes a step reads; one row: no fixed part)."""
    points = []
    for d, row in rows:
        batch, prompt, new = measured_decode(row)
        step = batch / row["samples_per_s"] / new
        points.append((decode_work(d, row.get("dtype", "bfloat16"), batch, prompt, new) * batch / new, step))
    if len(points) == 1:
        ((x, y),) = points
        return 0.0, y / x
    mx, my = (sum(p[i] for p in points) / len(points) for i in (0, 1))
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    fixed = my - slope * mx
    return (fixed, slope) if fixed >= 0 and slope > 0 else (0.0, my / mx)


def answers_seconds(
    d: Dims, dtype: str, batch: int, prompt: float, new: int, cost: tuple[float, float]
) -> float:
    """GPU wall seconds of one answer: its share of `new` decode steps at `batch` rows, each a fixed part
    and the bytes it reads (`step_cost`)."""
    fixed, per_byte = cost
    return new * fixed / batch + per_byte * decode_work(d, dtype, batch, prompt, new)
