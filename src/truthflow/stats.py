"""Confidence intervals of the tables and figures (numpy only: a plot job imports no model or probe code)."""

import numpy as np

# fewer samples have no CI: a bootstrap over 2-4 values has a handful of possible means (two zeros: [0, 0])
MIN_CI_N = 5


def bootstrap_ci(values: np.ndarray, n_boot: int, seed: int, alpha: float = 0.05) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean (seeded); under MIN_CI_N values: NaN, never a degenerate CI."""
    values = np.asarray(values, dtype=float)
    if len(values) < MIN_CI_N:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    resampled = rng.integers(0, len(values), size=(n_boot, len(values)))  # indices drawn with replacement
    means = values[resampled].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def wilson_ci(values: np.ndarray, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score 95% CI of a rate from values in [0, 1] (docs/method.md); NaN under MIN_CI_N values."""
    values = np.asarray(values, dtype=float)
    n = len(values)
    if n < MIN_CI_N:
        return float("nan"), float("nan")
    if values.min() < 0 or values.max() > 1:
        raise ValueError("wilson_ci takes values in [0, 1]")
    p = float(values.mean())
    z2n = z * z / n
    centre = (p + z2n / 2) / (1 + z2n)
    half = z / (1 + z2n) * np.sqrt(p * (1 - p) / n + z2n / (4 * n))
    lo = 0.0 if p == 0 else max(0.0, float(centre - half))
    hi = 1.0 if p == 1 else min(1.0, float(centre + half))
    return lo, hi
