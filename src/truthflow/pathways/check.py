"""The falsification test of the two-pathway finding (METHOD A7, A9).

"Q-Anchored ΔP below A-Anchored" follows from the split itself (a flip needs ΔP < 100·(0.5 − p)/p ≤ 0), so
it is no evidence. The evidence is that knocking out the exact question tokens E_Q moves the probe more
than knocking out as many random other question tokens: per (model, dataset), over the matched samples
(those whose question has at least |E_Q| non-E_Q tokens), each sample's flip rate and ΔP averaged over
layers (seeds and control draws averaged first), E_Q against the control, each mean with a seeded
bootstrap 95% CI over samples.

Verdict:
- **holds**: the E_Q flip rate's CI lies wholly above the control's AND the E_Q mean ΔP's CI wholly below
  the control's (CIs apart, both measures);
- **inconclusive**: fewer than `min_samples` matched samples, no control draws, or no probe;
- **does not hold**: otherwise.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from .probes import CONTROL, TARGET, bootstrap_ci

HOLDS, NOT_HOLD, INCONCLUSIVE = "holds", "does not hold", "inconclusive"

CHECK_SCHEMA = {
    "n_samples": pl.Int64,
    "n_unmatched": pl.Int64,
    "min_samples": pl.Int64,
    "flip_target": pl.Float64,
    "flip_target_low": pl.Float64,
    "flip_target_high": pl.Float64,
    "flip_control": pl.Float64,
    "flip_control_low": pl.Float64,
    "flip_control_high": pl.Float64,
    "flip_diff": pl.Float64,
    "flip_diff_low": pl.Float64,
    "flip_diff_high": pl.Float64,
    "delta_p_target": pl.Float64,
    "delta_p_target_low": pl.Float64,
    "delta_p_target_high": pl.Float64,
    "delta_p_control": pl.Float64,
    "delta_p_control_low": pl.Float64,
    "delta_p_control_high": pl.Float64,
    "verdict": pl.String,
    "reason": pl.String,
}


def per_sample_means(samples: pl.DataFrame, knockout: str) -> pl.DataFrame:
    """One row per matched sample: flip rate (%) and ΔP averaged over layers, for one knockout condition."""
    return (
        samples.filter((pl.col("knockout") == knockout) & pl.col("matched"))
        .group_by("id")
        .agg((pl.col("flip_rate").mean() * 100).alias("flip"), pl.col("delta_p").mean().alias("delta_p"))
        .sort("id")
    )


def _mean_ci(values: np.ndarray, n_boot: int, seed: int) -> tuple[float, float, float]:
    if len(values) == 0:
        return math.nan, math.nan, math.nan
    lo, hi = bootstrap_ci(values, n_boot, seed)
    return float(np.mean(values)), lo, hi


def verdict(row: dict) -> tuple[str, str]:
    """(verdict, reason) from a row with the CIs filled in."""
    if row["n_samples"] < row["min_samples"]:
        return INCONCLUSIVE, f"n = {row['n_samples']} matched samples < minimum {row['min_samples']}"
    flip_apart = row["flip_target_low"] > row["flip_control_high"]
    dp_apart = row["delta_p_target_high"] < row["delta_p_control_low"]
    if flip_apart and dp_apart:
        return HOLDS, "E_Q flips more and lowers p more than the random control, CIs apart"
    why = []
    if not flip_apart:
        why.append("flip-rate CIs overlap or reversed")
    if not dp_apart:
        why.append("ΔP CIs overlap or reversed")
    return NOT_HOLD, "; ".join(why)


def check(
    samples: pl.DataFrame,
    min_samples: int = 20,
    n_boot: int = 1000,
    seed: int = 0,
    probe_status: str | None = None,
) -> dict:
    """The E_Q-vs-control comparison of one (model, dataset); `samples` is run_probes' per-sample table."""
    row = dict.fromkeys(CHECK_SCHEMA)
    row["min_samples"] = min_samples
    unmatched = samples.filter(~pl.col("matched"))["id"].n_unique() if samples.height else 0
    row["n_unmatched"] = unmatched
    if probe_status:
        row.update(n_samples=0, verdict=INCONCLUSIVE, reason=probe_status)
        return row
    target, control = per_sample_means(samples, TARGET), per_sample_means(samples, CONTROL)
    row["n_samples"] = target.height
    if control.height == 0:
        row.update(verdict=INCONCLUSIVE, reason="no random-control draws (knockout.control_draws = 0)")
        return row
    both = target.join(control, on="id", suffix="_c")
    for name, values in (
        ("flip_target", both["flip"]),
        ("flip_control", both["flip_c"]),
        ("flip_diff", both["flip"] - both["flip_c"]),
        ("delta_p_target", both["delta_p"]),
        ("delta_p_control", both["delta_p_c"]),
    ):
        m, lo, hi = _mean_ci(values.to_numpy(), n_boot, seed)
        row[name], row[f"{name}_low"], row[f"{name}_high"] = m, lo, hi
    row["verdict"], row["reason"] = verdict(row)
    return row


def check_frame(row: dict, model: str, dataset: str) -> pl.DataFrame:
    return pl.DataFrame([row], schema=CHECK_SCHEMA).select(
        pl.lit(model).alias("model"), pl.lit(dataset).alias("dataset"), pl.all()
    )
