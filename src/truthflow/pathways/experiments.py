"""Section 3.2-5 experiments per Q-/A-Anchored group at layer K (docs/method.md A12-A17): token patching,
answer-only, knowledge boundary, saliency, awareness; cached states scored by the ΔP stage's probes at K."""

import numpy as np
import polars as pl

from ..errors import TruthflowError
from ..stats import bootstrap_ci, wilson_ci
from .activations import pr_pairs
from .detection import AWARENESS_SCHEMA, DETECTION_SCHEMA, awareness_auc, detection_table
from .probes import A_ANCHORED, Q_ANCHORED, TARGET, crossfit_seeds, knockout_effect, n_folds

GROUPS = (Q_ANCHORED, A_ANCHORED)
# the columns in front of every table of the experiments (k_layer: the layer K of the pair's experiments)
TABLE_KEYS = {"model": pl.String, "dataset": pl.String, "k_layer": pl.Int64}
ROW_SCHEMA = dict.fromkeys(["experiment", "condition", "group"], pl.String)
ROW_SCHEMA |= {"layer": pl.Int64, "n": pl.Int64}
ROW_SCHEMA |= dict.fromkeys(["value", "ci_low", "ci_high"], pl.Float64) | {"note": pl.String}
# exp_scores.parquet, extract.experiment_states' per-sample scores at layer K
SCORES_SCHEMA = {"id": pl.String, "layer": pl.Int64, "donor": pl.String}
SCORES_SCHEMA |= dict.fromkeys(["donor_length_matched", "patch_control_matched"], pl.Boolean)
SCORES_SCHEMA |= dict.fromkeys(["p_true", "logit_mean", "logit_min"], pl.Float64)
SCORES_SCHEMA |= dict.fromkeys(["s_eq_ea", "s_eq_all"], pl.List(pl.Float64))
# saliency.parquet: extract_pathways' saliency pass (A15) and the Logits baselines read off it (A17)
SALIENCY_SCHEMA = {c: SCORES_SCHEMA[c] for c in ("id", "logit_mean", "logit_min", "s_eq_ea", "s_eq_all")}
PER_SAMPLE_SCHEMA = {"id": pl.String, "group": pl.String, "correct": pl.Boolean}


def experiment_layer(setting, auc: pl.DataFrame, n_layers: int, model: str = "the model") -> tuple[int, str]:
    """Layer K (1-based) and why: an int setting (checked), 'auto' per docs/method.md or the middle layer."""
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
    return int(best["layer"][0]), f"auto: best mean probe AUC {best['auc'][0]:.3f}"


def groups_at(deltap: pl.DataFrame, ids: list[str], layer: int) -> np.ndarray:
    """Q-Anchored (True) / A-Anchored (False) per id: the target knockout's anchor at `layer`."""
    rows = deltap.filter((pl.col("knockout") == TARGET) & (pl.col("layer") == layer))
    anchor = dict(zip(rows["id"].to_list(), rows["anchor"].to_list(), strict=True))
    if missing := [i for i in ids if i not in anchor]:
        raise ValueError(
            f"{len(missing)} samples have no knockout anchor at layer {layer} (e.g. {missing[0]})"
        )
    return np.array([anchor[i] == Q_ANCHORED for i in ids])


def _group_rows(experiment, condition, values, groups, keep, at: dict, rate: bool = False) -> list[dict]:
    """Q- and A-Anchored rows of one condition at at["layer"]: n distinct samples, mean, 95% CI. rate: values
    are % and the CI is Wilson's; else a percentile bootstrap seeded by at["n_boot"], at["seed"]."""
    rows = []
    for g, name in ((True, Q_ANCHORED), (False, A_ANCHORED)):
        v = values[keep & (groups == g)]
        lo, hi = (
            (100.0 * b for b in wilson_ci(v / 100.0)) if rate else bootstrap_ci(v, at["n_boot"], at["seed"])
        )
        mean = float(v.mean()) if len(v) else float("nan")
        row = (experiment, condition, name, at["layer"], len(v), mean, lo, hi, "")
        rows.append(dict(zip(ROW_SCHEMA, row, strict=True)))
    return rows


def patching_rows(prob, prob_patch, prob_control, correct, groups, control_ok, at: dict) -> list[dict]:
    """Token patching (A12); the control counts only samples with one (|E_Q| other question tokens)."""
    eligible = correct.astype(bool) & (prob.mean(axis=0) >= 0.5)
    clean_ok = prob >= 0.5
    denom = np.maximum(clean_ok.sum(axis=0), 1)
    rows = []
    for cond, pp, keep in (("E_Q", prob_patch, eligible), ("random", prob_control, eligible & control_ok)):
        flip = 100.0 * ((pp < 0.5) & clean_ok).sum(axis=0) / denom
        rows += _group_rows("patching", cond, flip, groups, keep, at, rate=True)
    return rows


def answer_only_rows(prob: np.ndarray, prob_ao: np.ndarray, groups: np.ndarray, at: dict) -> list[dict]:
    """Answer-only (A13): −ΔP per sample, the state recomputed from the answer alone (seeds averaged)."""
    _, dp, _ = knockout_effect(prob, prob_ao)
    return _group_rows("answer_only", "-ΔP", -dp.mean(axis=0), groups, np.ones(len(groups), bool), at)


def boundary_rows(deltap: pl.DataFrame, correct: dict, refusal: dict, popularity, at: dict) -> list[dict]:
    """Knowledge boundary (A14) per group: answer accuracy and refusal rate (%) at every layer (the groups of
    that layer's knockout), and at K the entity popularity (log10 s_pop) where `popularity` has it."""
    rows = []
    for (lay,), grp in deltap.filter(knockout=TARGET).group_by(["layer"], maintain_order=True):
        ids, at_lay = grp["id"].to_list(), {**at, "layer": int(lay)}
        groups = np.array([a == Q_ANCHORED for a in grp["anchor"].to_list()])
        for cond, by_id in (("accuracy", correct), ("refusal", refusal)):
            rate = 100.0 * np.array([bool(by_id[i]) for i in ids], dtype=float)
            rows += _group_rows("boundary", cond, rate, groups, np.ones(len(ids), bool), at_lay, rate=True)
        if popularity is not None and int(lay) == at["layer"]:
            pop = np.array([popularity.get(i, np.nan) for i in ids], dtype=float)
            ok = np.isfinite(pop) & (pop > 0)
            logpop = np.log10(np.where(ok, pop, 1.0))  # the others are left out (keep=ok)
            rows += _group_rows("boundary", "log10 popularity", logpop, groups, ok, at_lay)
    return rows


def run(
    samples,
    scores,
    deltap,
    data,
    clean,
    states,
    probe: dict,
    boot: dict,
    factors: list,
    keys: dict,
    workers: int = 1,
):
    """Every experiment of one (model, dataset) at the layer K of `scores` -> the tables rows, awareness,
    detection, per_sample, `keys` and k_layer in front; states: patch, answer_only, pr (`activations`);
    workers: processes fitting the awareness probes' layers side by side."""
    k_layer, name = (int(scores["layer"][0]) if scores.height else None), "/".join(map(str, keys.values()))
    front = [*(pl.lit(v).alias(c) for c, v in keys.items()), pl.lit(k_layer, pl.Int64).alias("k_layer")]
    schemas = (ROW_SCHEMA, AWARENESS_SCHEMA, DETECTION_SCHEMA, PER_SAMPLE_SCHEMA)
    if samples.height == 0 or deltap.height == 0:
        print("experiments skipped:", "no samples" if samples.height == 0 else "probe undefined", flush=True)
        return [pl.DataFrame(schema=s).select(*front, pl.all()) for s in schemas]
    ids, labels, layer = samples["id"].to_list(), samples["correct"].to_numpy().astype(int), k_layer
    at = {"layer": layer, "n_boot": boot["n"], "seed": boot["seed"]}
    groups = groups_at(deltap, ids, layer)
    print(f"{name}: layer {layer}: {groups.sum()} Q-Anchored, {(~groups).sum()} A-Anchored", flush=True)
    patch, answer_only, pr = states
    x_new = [np.asarray(s, dtype=np.float32) for s in (patch[0], patch[1], answer_only)]
    x, k = np.asarray(clean[:, layer - 1], dtype=np.float32), n_folds(probe["test_size"])
    prob, *new = crossfit_seeds(x, x_new, labels, probe["seeds"], k, probe["C"], probe["max_iter"])
    control_ok = scores["patch_control_matched"].to_numpy()
    rows = patching_rows(prob, new[0], new[1], labels, groups, control_ok, at)
    rows += answer_only_rows(prob, new[2], groups, at)
    has_pop = "s_pop" in data.columns
    pop = dict(zip(data["id"], data["s_pop"].cast(pl.Float64), strict=True)) if has_pop else None
    correct, refusal = (dict(zip(ids, samples[c].to_list(), strict=True)) for c in ("correct", "refusal"))
    rows += boundary_rows(deltap, correct, refusal, pop, at)
    s_ea, s_all = (scores[c].list.mean().to_numpy() for c in ("s_eq_ea", "s_eq_all"))
    for cond, s in (("S(E_Q→E_A)", s_ea), ("S(E_Q→*)", s_all)):  # saliency (A15), averaged over layers
        rows += _group_rows("saliency", cond, s, groups, np.isfinite(s), at)
    per_sample = pl.DataFrame(
        {"id": ids, "group": np.where(groups, Q_ANCHORED, A_ANCHORED), "correct": labels.astype(bool)}
    ).with_columns(pl.Series("s_eq_ea", s_ea), pl.Series("s_eq_all", s_all))
    if has_pop:
        per_sample = per_sample.join(data.select("id", pl.col("s_pop").cast(pl.Float64)), on="id", how="left")
    other_layers = [i for i in range(1, clean.shape[1] + 1) if i != layer]
    aware = awareness_auc(clean, groups, other_layers, probe, workers)
    baselines = {"P(True)": "p_true", "Logits-mean": "logit_mean", "Logits-min": "logit_min"}
    baselines = {b: scores[c].to_numpy() for b, c in baselines.items()}
    det = detection_table(x, labels, groups, pr_pairs(pr, factors), baselines, factors, probe, probing=prob)
    rows = pl.DataFrame(rows, schema=ROW_SCHEMA)
    for r in rows.filter(pl.col("experiment") != "boundary").iter_rows(named=True):
        ci = f"[{r['ci_low']:.3g}, {r['ci_high']:.3g}] n={r['n']}"
        print(f"{name}: {r['experiment']} {r['condition']} {r['group']}: {r['value']:.3g} {ci}", flush=True)
    return [t.select(*front, pl.all()) for t in (rows, aware, det, per_sample)]
