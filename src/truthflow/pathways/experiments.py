"""The Section 3.2-5 experiments from cached states (docs/method.md A12-A17): token patching, answer-only,
knowledge boundary, saliency and pathway-awareness summaries, each per Q-/A-Anchored group with n as distinct
samples and seeded bootstrap 95% CIs. The groups are the ΔP stage's: the target knockout's anchor at the
experiment layer K. Probabilities on new states come from the same cross-fitted probes as the ΔP stage
(probes.crossfit_probs at layer K): every sample is scored by probes that never saw it.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from ..errors import TruthflowError
from ..stats import wilson_ci
from .probes import A_ANCHORED, Q_ANCHORED, TARGET, bootstrap_ci, crossfit_probs, knockout_effect

GROUPS = (Q_ANCHORED, A_ANCHORED)
ROW_SCHEMA = {
    "experiment": pl.String,
    "condition": pl.String,
    "group": pl.String,
    "layer": pl.Int64,
    "n": pl.Int64,
    "value": pl.Float64,
    "ci_low": pl.Float64,
    "ci_high": pl.Float64,
    "note": pl.String,
}


def experiment_layer(setting, auc: pl.DataFrame, n_layers: int, model: str = "the model") -> tuple[int, str]:
    """Layer K (1-based) and why: an integer setting is used as given (checked against the model's depth);
    'auto' takes the layer of the best mean cross-fitted probe AUC over seeds (ties: the lowest layer), or
    the middle layer when the probe is undefined."""
    if isinstance(setting, int) and not isinstance(setting, bool):
        if not 1 <= setting <= n_layers:
            raise TruthflowError(
                f"pathways.experiments.layer is {setting}, but {model} has {n_layers} layers: set a layer in "
                f"1..{n_layers}, or 'auto'"
            )
        return setting, "pathways.experiments.layer"
    ok = auc.filter((pl.col("status") == "ok") & pl.col("auc").is_not_null())
    if ok.height == 0:
        return max(1, n_layers // 2), "probe undefined: middle layer"
    best = ok.group_by("layer").agg(pl.col("auc").mean()).sort(["auc", "layer"], descending=[True, False])
    layer, value = int(best["layer"][0]), float(best["auc"][0])
    return layer, f"auto: best mean probe AUC {value:.3f}"


def groups_at(deltap: pl.DataFrame, ids: list[str], layer: int) -> np.ndarray:
    """Q-Anchored (True) / A-Anchored (False) per id: the target knockout's anchor at `layer`."""
    rows = deltap.filter((pl.col("knockout") == TARGET) & (pl.col("layer") == layer))
    anchor = dict(zip(rows["id"].to_list(), rows["anchor"].to_list(), strict=True))
    missing = [i for i in ids if i not in anchor]
    if missing:
        raise ValueError(
            f"{len(missing)} samples have no knockout anchor at layer {layer} (e.g. {missing[0]})"
        )
    return np.array([anchor[i] == Q_ANCHORED for i in ids])


def probe_at_layer(
    resid_clean: np.ndarray, layer: int, states: list[np.ndarray], labels: np.ndarray, probe: dict
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Out-of-fold probabilities of 'correct' at `layer` on the clean states [S, N] and on each new [N, D]
    state array [S, N], from the ΔP stage's cross-fitted probes (same seeds, folds and settings)."""
    clean = resid_clean[:, layer - 1 : layer]
    kos = [np.asarray(s, dtype=np.float32)[:, None, :] for s in states]
    prob, prob_new, _ = crossfit_probs(
        clean, kos, labels, probe["seeds"], probe["test_size"], probe["C"], probe["max_iter"]
    )
    return prob[:, :, 0], [prob_new[c, :, :, 0] for c in range(len(states))]


def _group_rows(
    experiment: str,
    condition: str,
    values: np.ndarray,
    groups: np.ndarray,
    keep: np.ndarray,
    layer: int,
    n_boot: int,
    seed: int,
    note: str = "",
    rate: bool = False,
) -> list[dict]:
    """Q- and A-Anchored rows of one condition: n distinct samples, mean, 95% CI. rate: values are % (a
    yes/no outcome or a share of seeds, x 100) and the CI is Wilson's (`stats.wilson_ci`: not zero width at
    0% or 100%); else a seeded percentile bootstrap."""
    rows = []
    for g, name in ((True, Q_ANCHORED), (False, A_ANCHORED)):
        v = values[keep & (groups == g)]
        if rate:
            lo, hi = (100.0 * b for b in wilson_ci(v / 100.0))
        else:
            lo, hi = bootstrap_ci(v, n_boot, seed)
        rows.append(
            {
                "experiment": experiment,
                "condition": condition,
                "group": name,
                "layer": layer,
                "n": int(len(v)),
                "value": float(v.mean()) if len(v) else float("nan"),
                "ci_low": lo,
                "ci_high": hi,
                "note": note,
            }
        )
    return rows


def patching_rows(
    prob: np.ndarray,
    prob_patch: np.ndarray,
    prob_control: np.ndarray,
    correct: np.ndarray,
    groups: np.ndarray,
    control_ok: np.ndarray,
    layer: int,
    n_boot: int,
    seed: int,
) -> list[dict]:
    """Token patching (A12). Eligible: answered correctly and predicted non-hallucinated by the probe (mean
    clean probability of 'correct' over seeds >= 0.5). Per sample, the flip rate is the share of seeds whose
    patched probability falls below 0.5 among the seeds that predicted 'correct' on the clean state; the group
    value is its mean in %. The control (|E_Q| random non-E_Q question tokens given the same donor ids) counts
    only samples with such a control."""
    eligible = correct.astype(bool) & (prob.mean(axis=0) >= 0.5)
    clean_ok = prob >= 0.5
    denom = np.maximum(clean_ok.sum(axis=0), 1)
    rows = []
    for cond, pp, keep in (("E_Q", prob_patch, eligible), ("random", prob_control, eligible & control_ok)):
        flip = 100.0 * ((pp < 0.5) & clean_ok).sum(axis=0) / denom
        rows += _group_rows("patching", cond, flip, groups, keep, layer, n_boot, seed, rate=True)
    return rows


def answer_only_rows(
    prob: np.ndarray, prob_ao: np.ndarray, groups: np.ndarray, layer: int, n_boot: int, seed: int
) -> list[dict]:
    """Answer-only (A13): −ΔP per sample (seeds averaged), the probe's drop in the probability of its clean
    prediction when the hidden state is recomputed from the answer alone; higher = more question-dependent."""
    _, dp, _ = knockout_effect(prob, prob_ao)
    keep = np.ones(len(groups), dtype=bool)
    return _group_rows("answer_only", "-ΔP", -dp.mean(axis=0), groups, keep, layer, n_boot, seed)


def boundary_rows(
    deltap: pl.DataFrame,
    correct: dict,
    refusal: dict,
    popularity: dict | None,
    layer: int,
    n_boot: int,
    seed: int,
) -> list[dict]:
    """Knowledge boundary (A14) per group: answer accuracy and refusal rate (%) at every layer (the groups of
    that layer's knockout), and at K the entity popularity (log10 s_pop) where the dataset has it."""
    rows = []
    target = deltap.filter(pl.col("knockout") == TARGET)
    for (lay,), grp in target.group_by(["layer"], maintain_order=True):
        ids = grp["id"].to_list()
        groups = np.array([a == Q_ANCHORED for a in grp["anchor"].to_list()])
        keep = np.ones(len(ids), dtype=bool)
        acc = 100.0 * np.array([bool(correct[i]) for i in ids], dtype=float)
        ref = 100.0 * np.array([bool(refusal[i]) for i in ids], dtype=float)
        rows += _group_rows("boundary", "accuracy", acc, groups, keep, int(lay), n_boot, seed, rate=True)
        rows += _group_rows("boundary", "refusal", ref, groups, keep, int(lay), n_boot, seed, rate=True)
        if popularity is not None and int(lay) == layer:
            pop = np.array([popularity.get(i, np.nan) for i in ids], dtype=float)
            ok = np.isfinite(pop) & (pop > 0)
            logpop = np.where(ok, np.log10(np.where(ok, pop, 1.0)), np.nan)
            rows += _group_rows("boundary", "log10 popularity", logpop, groups, ok, int(lay), n_boot, seed)
    return rows


def saliency_rows(
    s_eq_ea: np.ndarray, s_eq_all: np.ndarray, groups: np.ndarray, layer: int, n_boot: int, seed: int
) -> list[dict]:
    """Saliency (A15) per group: S(E_Q→E_A) and S(E_Q→*), each averaged over layers per sample."""
    keep = np.isfinite(s_eq_ea)
    return _group_rows("saliency", "S(E_Q→E_A)", s_eq_ea, groups, keep, layer, n_boot, seed) + _group_rows(
        "saliency", "S(E_Q→*)", s_eq_all, groups, np.isfinite(s_eq_all), layer, n_boot, seed
    )


def rows_frame(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=ROW_SCHEMA)
