"""Per-layer cross-fitted correctness probes (A6), ΔP under knockout (A8), Q-/A-Anchored split (A9), bootstrap
summary (A10); per sample and layer the seeds are averaged (flip: the share that flip): n counts samples."""

from collections.abc import Sequence
from itertools import product

import numpy as np
import polars as pl

from ..stats import bootstrap_ci

Q_ANCHORED, A_ANCHORED, ALL = "Q-Anchored", "A-Anchored", "all"
TARGET, CONTROL = "target", "control"

AUC_SCHEMA = {"seed": pl.Int64, "layer": pl.Int64, "auc": pl.Float64}
AUC_SCHEMA |= dict.fromkeys(["n_train", "n_test", "n_folds"], pl.Int64) | {"status": pl.String}
DELTAP_SCHEMA = {"id": pl.String, "layer": pl.Int64, "knockout": pl.String, "label": pl.Boolean}
DELTAP_SCHEMA |= {"matched": pl.Boolean, "n_seeds": pl.Int64}
DELTAP_SCHEMA |= dict.fromkeys(["p", "delta_p", "flip_rate"], pl.Float64) | {"anchor": pl.String}
SUMMARY_SCHEMA = dict.fromkeys(["knockout", "anchor"], pl.String) | dict.fromkeys(["layer", "n"], pl.Int64)
SUMMARY_SCHEMA |= dict.fromkeys(["mean_delta_p", "ci_low", "ci_high", "flip_rate"], pl.Float64)


def n_folds(test_size: float) -> int:
    return max(2, round(1 / test_size))


def split_reason(labels: np.ndarray, k: int, pos: str = "correct", neg: str = "wrong") -> str | None:
    """Why a stratified K-fold split over these binary labels cannot be made, or None."""
    n_pos = int(np.sum(labels))
    n_neg = len(labels) - n_pos
    counts = f"({n_pos} {pos}, {n_neg} {neg})"
    if n_pos == 0 or n_neg == 0:
        return f"one class only {counts}"
    if min(n_pos, n_neg) < 2:
        return f"too few samples per class for a stratified split {counts}"
    if max(n_pos, n_neg) < k:
        return f"fewer samples per class than the {k} folds {counts}"
    return None


# scikit-learn is imported where used: the model jobs import this module, and would each pay its ~1 s import
def roc_auc(y, score) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, score))


def fit_predict(x_train, y_train, tests: list[np.ndarray], C: float, max_iter: int) -> list[np.ndarray]:
    """The probe: StandardScaler + LogisticRegression(C, max_iter); P(class 1) for each array in tests."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(x_train)
    clf = LogisticRegression(C=C, max_iter=max_iter).fit(scaler.transform(x_train), y_train)
    return [clf.predict_proba(scaler.transform(x))[:, 1] for x in tests]


def folds(y, k: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The seeded stratified K-fold split over y that every cross-fitted estimate uses."""
    from sklearn.model_selection import StratifiedKFold

    return list(StratifiedKFold(n_splits=k, shuffle=True, random_state=seed).split(np.zeros(len(y)), y))


def crossfit(x, y, seed: int, k: int, C: float, max_iter: int, extra=()) -> list[np.ndarray]:
    """Out-of-fold P(y = 1) for every row of x and of each array in `extra` (other states of the samples)."""
    outs = np.zeros((1 + len(extra), len(y)))
    for train, test in folds(y, k, seed):
        outs[:, test] = fit_predict(x[train], y[train], [x[test], *(e[test] for e in extra)], C, max_iter)
    return list(outs)


def crossfit_seeds(x, extra: list, y, seeds, k: int, C: float, max_iter: int) -> np.ndarray:
    """crossfit over the seeds: [1 + len(extra), S, N] (x first, then each array of extra)."""
    return np.array([crossfit(x, y, seed, k, C, max_iter, extra) for seed in seeds]).swapaxes(0, 1)


def anchors(flip_rate: np.ndarray, split: str = "per_layer", fixed_layer: int | None = None) -> np.ndarray:
    """flip_rate [N, L] in [0, 1] -> METHOD A9's groups; fixed_layer K (1-based): K's for every layer."""
    q = np.asarray(flip_rate, dtype=float) > 0.5
    if split == "fixed_layer":  # else per_layer (the schema's enum)
        if fixed_layer is None or not 1 <= fixed_layer <= q.shape[1]:
            raise ValueError(f"fixed_layer must be in 1..{q.shape[1]}, got {fixed_layer}")
        q = np.repeat(q[:, fixed_layer - 1 : fixed_layer], q.shape[1], axis=1)
    return np.where(q, Q_ANCHORED, A_ANCHORED)


def knockout_effect(prob: np.ndarray, prob_ko: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """prob, prob_ko: [..., N, L] P(correct) -> (p, ΔP, flipped) of METHOD A8 (p: of the clean class)."""
    pred = prob >= 0.5
    p = np.where(pred, prob, 1 - prob)
    p_ko = np.where(pred, prob_ko, 1 - prob_ko)
    return p, 100.0 * (p_ko - p) / p, pred != (prob_ko >= 0.5)


def over_layers(function, layers: Sequence[int], workers: int, *args) -> list:
    """[function(layer, *args) for layer in layers], up to `workers` processes fitting layers side by side.

    The per-layer probes are the CPU cost of a paper run (80 layers × 15 fits for a 70B model). A worker gets
    memory-mapped arrays as file references (joblib's memmapping reducer), reads its own layer, and runs one
    BLAS thread when the workers fill the cores (joblib's default). Each fit is the same call as in one
    process: tests/test_probes.py shows the tables equal."""
    if workers <= 1 or len(layers) <= 1:
        return [function(layer, *args) for layer in layers]
    from joblib import Parallel, delayed

    return Parallel(n_jobs=min(workers, len(layers)))(delayed(function)(layer, *args) for layer in layers)


def layer_probs(layer: int, states: list, labels: np.ndarray, seeds, k: int, C: float, max_iter: int):
    """crossfit_seeds on one layer (0-based) of each state array ([N, L, D] views, clean first): the layer
    alone is read, so memory stays bounded in L."""
    x, *x_ko = (np.asarray(r[:, layer], dtype=np.float32) for r in states)
    return crossfit_seeds(x, x_ko, labels, seeds, k, C, max_iter)


def run_probes(
    resid_clean,
    resid_kos: list,
    labels: np.ndarray,
    ids: list[str],
    probe: dict,
    matched=None,
    workers: int = 1,
    **split,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Cross-fitted probes per layer and seed; resid_kos: the target knockout, then the control draws; split:
    `anchors`' kwargs; workers: processes fitting layers side by side. Returns (AUC table, ΔP table per
    sample × layer × knockout, seeds, draws averaged)."""
    n, n_layers, _ = resid_clean.shape
    seeds, k = probe["seeds"], n_folds(probe["test_size"])
    if reason := split_reason(labels, k):
        row = {"n_train": 0, "n_test": 0, "n_folds": 0, "status": f"probe undefined: {reason}"}
        return pl.DataFrame([row], schema=AUC_SCHEMA), pl.DataFrame(schema=DELTAP_SCHEMA)
    matched = np.ones(n, dtype=bool) if matched is None else np.asarray(matched, dtype=bool)
    prob = np.zeros((len(resid_kos) + 1, len(seeds), n, n_layers))  # clean, then each knockout
    states, fit = [resid_clean, *resid_kos], (probe["C"], probe["max_iter"])
    per_layer = over_layers(layer_probs, range(n_layers), workers, states, labels, seeds, k, *fit)
    for layer, probs in enumerate(per_layer):
        prob[..., layer] = probs
    frames = []
    groups = [(TARGET, prob[1:2])] + ([(CONTROL, prob[2:])] if len(resid_kos) > 1 else [])
    for name, pk in groups:
        p, dp, flipped = knockout_effect(prob[None, 0], pk)  # [draws, S, N, L]
        flip_rate = flipped.mean(axis=(0, 1))
        frame = {
            "id": np.repeat(np.asarray(ids, dtype=object), n_layers).tolist(),
            "layer": np.tile(np.arange(1, n_layers + 1), n),
            "knockout": [name] * (n * n_layers),
            "label": np.repeat(labels.astype(bool), n_layers),
            "matched": np.repeat(matched, n_layers),
            "n_seeds": np.full(n * n_layers, len(seeds)),
            "p": p.mean(axis=(0, 1)).ravel(),
            "delta_p": dp.mean(axis=(0, 1)).ravel(),
            "flip_rate": flip_rate.ravel(),
            "anchor": anchors(flip_rate, **split).ravel(),
        }
        frames.append(pl.DataFrame(frame, schema=DELTAP_SCHEMA))
    grid = product(enumerate(seeds), range(n_layers))
    rows = [[seed, i + 1, roc_auc(labels, prob[0, s, :, i]), n - n // k, n, k, "ok"] for (s, seed), i in grid]
    return pl.DataFrame(rows, schema=AUC_SCHEMA, orient="row"), pl.concat(frames)


def summarize(samples: pl.DataFrame, n_boot: int = 1000, seed: int = 0) -> pl.DataFrame:
    """Per (knockout, anchor, layer): n distinct samples, mean ΔP, its seeded bootstrap 95% CI and the mean
    flip rate; anchor 'all' and every control row are over the matched samples only (METHOD A7, A10)."""
    split = samples.filter((pl.col("knockout") == TARGET) | pl.col("matched"))
    unsplit = samples.filter(pl.col("matched")).with_columns(pl.lit(ALL).alias("anchor"))
    rows = []
    for (knockout, anchor, layer), grp in pl.concat([split, unsplit]).group_by("knockout", "anchor", "layer"):
        vals = grp["delta_p"].to_numpy()
        lo, hi = bootstrap_ci(vals, n_boot, seed + int(layer))
        n, flip = grp["id"].n_unique(), grp["flip_rate"].mean()
        rows.append([knockout, anchor, int(layer), n, float(vals.mean()), lo, hi, flip])
    return pl.DataFrame(rows, schema=SUMMARY_SCHEMA, orient="row").sort(["knockout", "anchor", "layer"])


def auc_by_layer(auc: pl.DataFrame) -> pl.DataFrame:
    """The probe AUC per (model, dataset, layer, status) over the seeds: mean, min, max (3 decimals)."""
    stats = (getattr(pl.col("auc"), f)().round(3).alias(f"{f}_auc") for f in ("mean", "min", "max"))
    by_layer = auc.group_by(["model", "dataset", "layer", "status"], maintain_order=True)
    table = by_layer.agg(*stats, pl.col("seed").n_unique().alias("n_seeds"), pl.col("n_test").first())
    return table.sort(["model", "dataset", "layer"], nulls_last=True)
