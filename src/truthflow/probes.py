"""Per-layer correctness probes (METHOD A6), ΔP under knockout (A8), the Q-/A-Anchored split (A9) and the
seeded bootstrap summary (A10)."""

from __future__ import annotations

import numpy as np
import polars as pl
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

Q_ANCHORED, A_ANCHORED = "Q-Anchored", "A-Anchored"


def probe_undefined_reason(labels: np.ndarray, test_size: float) -> str | None:
    """Why a stratified split + probe cannot be made (one class, too few of a class), or None."""
    n_pos = int(labels.sum())
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return f"one class only ({n_pos} correct, {n_neg} wrong)"
    n_test = int(np.ceil(test_size * len(labels)))
    if min(n_pos, n_neg) < 2 or n_test < 2 or len(labels) - n_test < 2:
        return f"too few samples per class for a stratified split ({n_pos} correct, {n_neg} wrong)"
    return None


def delta_p(p_clean: np.ndarray, p_ko_same_class: np.ndarray) -> np.ndarray:
    """ΔP = 100·(p_ko − p)/p, where p is the probe's probability of its predicted class on the clean state
    and p_ko the probability of that same class on the knocked-out state."""
    return 100.0 * (p_ko_same_class - p_clean) / p_clean


def anchors(flipped: np.ndarray, split: str = "per_layer", fixed_layer: int | None = None) -> np.ndarray:
    """flipped: [N, L] bool. per_layer: Q-Anchored where the prediction flips at that layer; fixed_layer K
    (1-based): the group assigned at layer K holds for every layer."""
    if split == "per_layer":
        q = flipped
    elif split == "fixed_layer":
        if fixed_layer is None or not 1 <= fixed_layer <= flipped.shape[1]:
            raise ValueError(f"fixed_layer must be in 1..{flipped.shape[1]}, got {fixed_layer}")
        q = np.repeat(flipped[:, fixed_layer - 1 : fixed_layer], flipped.shape[1], axis=1)
    else:
        raise ValueError(f"unknown anchor_split '{split}'")
    return np.where(q, Q_ANCHORED, A_ANCHORED)


def run_probes(
    resid_clean: np.ndarray,
    resid_ko: np.ndarray,
    labels: np.ndarray,
    ids: list[str],
    seeds: list[int],
    test_size: float = 0.2,
    C: float = 1.0,
    max_iter: int = 2000,
    anchor_split: str = "per_layer",
    fixed_layer: int | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Probe every layer for every seed. Returns (auc table: seed, layer, auc, n_train, n_test, status;
    per test sample × layer table: seed, id, layer, label, pred, p, p_ko, delta_p, flipped, anchor)."""
    n, n_layers, _ = resid_clean.shape
    reason = probe_undefined_reason(labels, test_size)
    if reason:
        auc = pl.DataFrame(
            {
                "seed": [None],
                "layer": [None],
                "auc": [None],
                "n_train": [0],
                "n_test": [0],
                "status": [f"probe undefined: {reason}"],
            },
            schema={
                "seed": pl.Int64,
                "layer": pl.Int64,
                "auc": pl.Float64,
                "n_train": pl.Int64,
                "n_test": pl.Int64,
                "status": pl.String,
            },
        )
        return auc, empty_samples()
    auc_rows, sample_frames = [], []
    idx = np.arange(n)
    for seed in seeds:
        train, test = train_test_split(idx, test_size=test_size, random_state=seed, stratify=labels)
        p = np.zeros((len(test), n_layers))
        p_ko = np.zeros_like(p)
        pred = np.zeros((len(test), n_layers), dtype=bool)
        pred_ko = np.zeros_like(pred)
        for layer in range(n_layers):
            x_train = resid_clean[train, layer].astype(np.float32)
            scaler = StandardScaler().fit(x_train)
            clf = LogisticRegression(C=C, max_iter=max_iter)
            clf.fit(scaler.transform(x_train), labels[train])
            prob = clf.predict_proba(scaler.transform(resid_clean[test, layer].astype(np.float32)))[:, 1]
            prob_ko = clf.predict_proba(scaler.transform(resid_ko[test, layer].astype(np.float32)))[:, 1]
            auc_rows.append(
                {
                    "seed": seed,
                    "layer": layer + 1,
                    "auc": float(roc_auc_score(labels[test], prob)),
                    "n_train": len(train),
                    "n_test": len(test),
                    "status": "ok",
                }
            )
            pred[:, layer] = prob >= 0.5
            pred_ko[:, layer] = prob_ko >= 0.5
            # probability of the class predicted on the clean state, before and after the knockout
            p[:, layer] = np.where(pred[:, layer], prob, 1 - prob)
            p_ko[:, layer] = np.where(pred[:, layer], prob_ko, 1 - prob_ko)
        flipped = pred != pred_ko
        anchor = anchors(flipped, anchor_split, fixed_layer)
        sample_frames.append(
            pl.DataFrame(
                {
                    "seed": np.full(len(test) * n_layers, seed),
                    "id": np.repeat(np.asarray(ids, dtype=object)[test], n_layers).tolist(),
                    "layer": np.tile(np.arange(1, n_layers + 1), len(test)),
                    "label": np.repeat(labels[test].astype(bool), n_layers),
                    "pred": pred.ravel(),
                    "p": p.ravel(),
                    "p_ko": p_ko.ravel(),
                    "delta_p": delta_p(p, p_ko).ravel(),
                    "flipped": flipped.ravel(),
                    "anchor": anchor.ravel(),
                }
            )
        )
    return pl.DataFrame(auc_rows), pl.concat(sample_frames)


def empty_samples() -> pl.DataFrame:
    return pl.DataFrame(
        schema={
            "seed": pl.Int64,
            "id": pl.String,
            "layer": pl.Int64,
            "label": pl.Boolean,
            "pred": pl.Boolean,
            "p": pl.Float64,
            "p_ko": pl.Float64,
            "delta_p": pl.Float64,
            "flipped": pl.Boolean,
            "anchor": pl.String,
        }
    )


def bootstrap_ci(values: np.ndarray, n_boot: int, seed: int, alpha: float = 0.05) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean, resampling samples with a seeded generator."""
    values = np.asarray(values, dtype=float)
    if len(values) == 0:
        return float("nan"), float("nan")
    if len(values) == 1:
        return float(values[0]), float(values[0])
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(n_boot, len(values)))].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def summarize(samples: pl.DataFrame, n_boot: int = 1000, seed: int = 0) -> pl.DataFrame:
    """Per (anchor, layer): n, mean ΔP and its seeded bootstrap 95% CI."""
    rows = []
    for (anchor, layer), grp in samples.group_by(["anchor", "layer"], maintain_order=True):
        vals = grp["delta_p"].to_numpy()
        lo, hi = bootstrap_ci(vals, n_boot, seed + int(layer))
        rows.append(
            {
                "anchor": anchor,
                "layer": int(layer),
                "n": len(vals),
                "mean_delta_p": float(vals.mean()),
                "ci_low": lo,
                "ci_high": hi,
            }
        )
    schema = {
        "anchor": pl.String,
        "layer": pl.Int64,
        "n": pl.Int64,
        "mean_delta_p": pl.Float64,
        "ci_low": pl.Float64,
        "ci_high": pl.Float64,
    }
    return pl.DataFrame(rows, schema=schema).sort(["anchor", "layer"])
