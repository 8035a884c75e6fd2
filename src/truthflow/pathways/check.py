"""The falsification test (METHOD A7, A9): per matched sample diff = E_Q − control knockout, a one-sided
paired t-test, Holm over the run's cells, a ±SESOI equivalence test; `check`: a cell's n, mean, sd of diff."""

import math

import numpy as np
import polars as pl
import polars.selectors as cs
from scipy import optimize, stats

from .probes import CONTROL, TARGET

HOLDS = "holds"
NOT_HOLD = "does not hold"
INCONCLUSIVE = "inconclusive"
# the sign of E_Q − control that the papers predict: E_Q lowers p more (ΔP), E_Q flips more (flip rate)
MEASURES = {"delta_p": -1, "flip_rate": 1}
UNITS = {"delta_p": "ΔP points", "flip_rate": "flip-rate points (%)"}
NAMES = {"delta_p": "ΔP", "flip_rate": "flip rate"}
POWER = 0.8  # the power that mde and n_needed plan for
N_MAX = 2**24  # n_needed's largest n

CELL_SCHEMA = {
    "range": pl.String,  # all | second_half | explicit | middle_third
    "layers": pl.String,
    "layer_from": pl.Int64,
    "layer_to": pl.Int64,
    "measure": pl.String,
    "n_samples": pl.Int64,
    "n_unmatched": pl.Int64,
    "n_minority": pl.Int64,
    "probe_auc": pl.Float64,
    "target": pl.Float64,
    "control": pl.Float64,
    "diff": pl.Float64,
    "sd": pl.Float64,
    "status": pl.String,  # why a cell has no test (null: it has one)
}
TEST_COLUMNS = {
    "diff": pl.Float64,
    "diff_low": pl.Float64,
    "diff_high": pl.Float64,
    "p_value": pl.Float64,
    "p_holm": pl.Float64,
    "sesoi": pl.Float64,
    "mde": pl.Float64,
    "n_needed": pl.Int64,
    "verdict": pl.String,
}
CHECK_SCHEMA = {
    "model": pl.String,
    "dataset": pl.String,
    "measure": pl.String,
    "layers": pl.String,
    "n_samples": pl.Int64,
    **TEST_COLUMNS,
    "reason": pl.String,
    "verdict_cell": pl.String,  # the cell without the family-wise correction
    "level": pl.Float64,  # the corrected bounds' one-sided level
    "secondary_measure": pl.String,
    "secondary_diff": pl.Float64,
    "secondary_low": pl.Float64,
    "secondary_high": pl.Float64,
    "secondary_p": pl.Float64,
    "flip_target": pl.Float64,
    "flip_control": pl.Float64,
    "delta_p_target": pl.Float64,
    "delta_p_control": pl.Float64,
    **{c: CELL_SCHEMA[c] for c in ("layer_from", "layer_to", "n_unmatched", "n_minority", "probe_auc")},
}
DROPPED_SCHEMA = {
    "model": pl.String,
    "dataset": pl.String,
    "reason": pl.String,
    "n": pl.UInt32,
    "detail": pl.String,
}
# the sensitivity table: the check table's test columns per layer range
LAYERS_SCHEMA = dict.fromkeys(["model", "dataset", "range", "layers", "measure"], pl.String)
LAYERS_SCHEMA |= {c: CHECK_SCHEMA[c] for c in ("n_samples", *TEST_COLUMNS, "reason")}


def layer_ranges(n_layers: int, layers) -> list[tuple[str, int, int]]:
    """The ranges (name, from, to; 1-based, inclusive): all, second_half, explicit (cut) or middle_third."""
    if isinstance(layers, list | tuple):
        third = ("explicit", max(1, int(layers[0])), min(n_layers, int(layers[1])))
    else:
        third = ("middle_third", n_layers // 3 + 1, max(n_layers // 3 + 1, 2 * n_layers // 3))
    return [("all", 1, n_layers), ("second_half", min(n_layers // 2 + 1, n_layers), n_layers), third]


def per_sample_means(samples: pl.DataFrame, knockout: str, lo: int = 1, hi=None) -> pl.DataFrame:
    """One row per matched sample: flip rate (%) and ΔP averaged over layers lo..hi, for one knockout."""
    keep = (pl.col("knockout") == knockout) & pl.col("matched") & (pl.col("layer") >= lo)
    if hi is not None:
        keep &= pl.col("layer") <= hi
    means = pl.col("flip_rate").mean() * 100, pl.col("delta_p").mean(), pl.col("label").first()
    return samples.filter(keep).group_by("id").agg(*means).sort("id")


def check(samples: pl.DataFrame, auc=None, layers="second_half", probe_status=None) -> pl.DataFrame:
    """Per (layer range, measure): a CELL_SCHEMA row, from run_probes' two tables (`auc` may be None)."""
    unmatched = samples.filter(~pl.col("matched"))["id"].n_unique() if samples.height else 0
    no_control = not samples.filter(pl.col("knockout") == CONTROL).height
    if probe_status:
        status = probe_status
    elif no_control:
        status = "no random-control draws (knockout.control_draws = 0)"
    else:
        status = None
    n_layers = 0 if status or not samples.height else int(samples["layer"].max())
    ranges = layer_ranges(max(n_layers, 1), layers)
    if not n_layers:  # no test: the ranges' names only
        ranges = [(name, None, None) for name, _, _ in ranges]
    ok = auc.filter(pl.col("status") == "ok") if auc is not None and auc.height else None
    rows = []
    for name, lo, hi in ranges:
        base = {"range": name, "layers": name, "layer_from": lo, "layer_to": hi, "n_unmatched": unmatched}
        if lo is None or lo > hi:
            why = status or f"no layer of {n_layers} in the configured range {layers}"
            rows += [{**base, "measure": m, "n_samples": 0, "status": why} for m in MEASURES]
            continue
        base["layers"] = f"{name} ({lo}-{hi})"
        target = per_sample_means(samples, TARGET, lo, hi)
        control = per_sample_means(samples, CONTROL, lo, hi)
        both = target.join(control.drop("label"), on="id", suffix="_c")
        n = both.height
        n_correct = int(both["label"].sum())
        in_range = pl.col("layer").is_between(lo, hi)
        probe_auc = ok.filter(in_range)["auc"].mean() if ok is not None else None
        base |= {"n_samples": n, "n_minority": min(n_correct, n - n_correct), "probe_auc": probe_auc}
        for measure in MEASURES:
            d = (both[measure] - both[f"{measure}_c"]).to_numpy()
            diff = float(d.mean()) if len(d) else None
            sd = float(d.std(ddof=1)) if len(d) > 1 else None
            means = {"target": both[measure].mean(), "control": both[f"{measure}_c"].mean()}  # empty: None
            rows.append({**base, **means, "measure": measure, "diff": diff, "sd": sd})
    return pl.DataFrame(rows, schema=CELL_SCHEMA)


def holm(p, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Holm–Bonferroni over the last axis (NaN: untested) -> (adjusted p, each cell's one-sided level, A7)."""
    p = np.asarray(p, dtype=float)
    order = np.argsort(p, axis=-1)  # NaN last
    ps = np.take_along_axis(p, order, -1)
    m = np.sum(~np.isnan(p), axis=-1, keepdims=True)
    factor = np.maximum(m - np.arange(p.shape[-1]), 1)
    adjusted = np.maximum.accumulate(np.fmin(ps * factor, 1.0), axis=-1)
    step = alpha / factor
    passed = np.logical_and.accumulate(ps <= step, axis=-1)
    stop = np.minimum(passed.sum(axis=-1, keepdims=True), p.shape[-1] - 1)
    level = np.where(passed, step, np.take_along_axis(step, stop, -1))
    inverse = np.argsort(order, axis=-1)

    def in_input_order(a: np.ndarray) -> np.ndarray:  # untested cells: NaN
        return np.where(np.isnan(p), np.nan, np.take_along_axis(a, inverse, -1))

    return in_input_order(adjusted), in_input_order(level)


def decide(low, high, sign: int, sesoi: float) -> np.ndarray:
    """holds / does not hold / inconclusive from the corrected interval (NaN bounds: inconclusive)."""
    low = np.asarray(low, dtype=float)
    high = np.asarray(high, dtype=float)
    if sign > 0:  # the bounds in the predicted direction
        lo, hi = low, high
    else:
        lo, hi = -high, -low
    out = np.full(lo.shape, INCONCLUSIVE, dtype=object)
    equivalent = (lo > -sesoi) & (hi < sesoi)  # TOST: within ±SESOI
    wrong_way = hi < 0
    out[equivalent | wrong_way] = NOT_HOLD
    out[lo > 0] = HOLDS
    return out


def verdicts(mean, sd, n, sign: int, sesoi: float, alpha: float = 0.05, correct: bool = True) -> dict:
    """A family's tests over the last axis (cells) from the diffs' mean (NaN: untested), sd and n: p (paired
    t, one-sided: sign·diff > 0), p_holm, level, the bounds low, high (a 1 − 2·level interval), verdict."""
    mean, sd, n = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (mean, sd, n)))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = stats.t.sf(sign * mean / (sd / np.sqrt(n)), n - 1)
        p = np.where(np.isfinite(mean) & (sd > 0) & (n > 1), t, np.nan)
        if correct:
            p_holm, level = holm(p, alpha)
        else:  # each cell on its own, at alpha
            p_holm, level = p, np.where(np.isnan(p), np.nan, alpha)
        half = stats.t.isf(level, n - 1) * sd / np.sqrt(n)
    low, high = mean - half, mean + half
    return dict(p=p, p_holm=p_holm, level=level, low=low, high=high, verdict=decide(low, high, sign, sesoi))


def power(effect: float, sd: float, n: int, level: float) -> float:
    """Power of the one-sided paired t-test at `level` for a true mean diff `effect` (> 0)."""
    return float(stats.nct.sf(stats.t.isf(level, n - 1), n - 1, effect * math.sqrt(n) / sd))


def mde(sd: float, n: int, level: float) -> float:
    """The smallest true effect the test detects with probability POWER at this n (noncentral t)."""
    if not (n > 1 and sd > 0):
        return math.nan
    return optimize.brentq(lambda e: power(e, sd, n, level) - POWER, 1e-12 * sd, 100 * sd)


def n_needed(effect: float, sd: float, level: float) -> int | None:
    """The smallest n <= N_MAX whose one-sided test detects `effect` with probability POWER (None: no sd)."""
    if not (sd > 0 and effect > 0):
        return None
    if power(effect, sd, 2, level) >= POWER:
        return 2
    if power(effect, sd, N_MAX, level) < POWER:
        return N_MAX
    return math.ceil(optimize.brentq(lambda n: power(effect, sd, n, level) - POWER, 2, N_MAX))


def _gate(row: dict, cfg: dict) -> str | None:
    """Why this cell gets no test (it says inconclusive), or None."""
    n = row["n_samples"] or 0
    if row["status"]:
        return row["status"]
    if n < cfg["min_samples"]:
        return f"n = {n} matched samples < minimum {cfg['min_samples']}"
    minority = row["n_minority"]
    if minority < max(cfg["min_minority"], cfg["min_minority_share"] * n):
        return (
            f"too little signal: the minority class has {minority} of {n} samples (< {cfg['min_minority']}"
            f" or < {cfg['min_minority_share']:.0%}); the probe calls nearly every sample one class, so"
            " little can flip under either knockout"
        )
    if row["probe_auc"] is None or row["probe_auc"] < cfg["min_auc"]:
        auc = "undefined" if row["probe_auc"] is None else f"{row['probe_auc']:.2f}"
        return f"too little signal: probe AUC {auc} over layers {row['layers']} < {cfg['min_auc']}"
    if not (row["sd"] or 0) > 0:
        return "the per-sample differences have no spread"


def _reason(v: str, sign: int, lo: float, hi: float, level: float, row: dict, cfg: dict) -> str:
    ci = f"[{lo:.2f}, {hi:.2f}] (one-sided level {level:.4f} each side)"
    sesoi = f"±{cfg['sesoi']:g} {UNITS[row['measure']]}"
    if v == HOLDS:
        small = f"; |diff| is below SESOI {cfg['sesoi']:g}" if abs(row["diff"]) < cfg["sesoi"] else ""
        return f"p_holm = {row['p_holm']:.4f} ≤ {cfg['alpha']}: the corrected interval {ci} excludes 0{small}"
    if v == NOT_HOLD and (lo > 0 if sign < 0 else hi < 0):
        return f"the effect goes the wrong way: {ci} excludes 0"
    if v == NOT_HOLD:
        return f"equivalence: {ci} lies within {sesoi}"
    return (
        f"{ci} neither excludes 0 nor lies within {sesoi}; detectable at 80% power: {row['mde']:.2f} at"
        f" n = {row['n_samples']}, SESOI needs n = {row['n_needed']}"
    )


def _floats(table: pl.DataFrame, column: str) -> np.ndarray:
    """A column as float64, null as NaN."""
    return table[column].fill_null(np.nan).to_numpy().astype(float)


def _family(rows: pl.DataFrame, cfg: dict) -> pl.DataFrame:
    """One family (one measure, one layer range, every cell of the run): gates, tests, Holm, verdicts."""
    sign = MEASURES[rows["measure"][0]]
    sesoi = float(cfg["sesoi"])
    records = rows.to_dicts()
    gates = [_gate(r, cfg) for r in records]
    tested = np.array([g is None for g in gates])
    n = _floats(rows, "n_samples")
    sd = _floats(rows, "sd")
    mean = _floats(rows, "diff")
    fam = verdicts(np.where(tested, mean, np.nan), sd, n, sign, sesoi, cfg["alpha"])
    cell = verdicts(mean, sd, n, sign, sesoi, cfg["alpha"], correct=False)  # per cell, untested ones too
    for i, r in enumerate(records):
        if tested[i]:
            level = float(fam["level"][i])
        else:  # an untested cell's planning numbers at Bonferroni's level, the strictest step of Holm
            level = cfg["alpha"] / max(int(tested.sum()), 1)
        r.update(sesoi=sesoi, level=level, mde=None, n_needed=None, p_value=None)
        if n[i] > 1 and sd[i] > 0:
            p = float(cell["p"][i])
            r.update(p_value=p, mde=mde(sd[i], int(n[i]), level), n_needed=n_needed(sesoi, sd[i], level))
        if not tested[i]:
            r.update(verdict=INCONCLUSIVE, verdict_cell=INCONCLUSIVE, reason=gates[i])
            continue
        lo, hi = float(fam["low"][i]), float(fam["high"][i])
        r.update(diff_low=lo, diff_high=hi, p_holm=float(fam["p_holm"][i]), verdict=fam["verdict"][i])
        r.update(verdict_cell=cell["verdict"][i], reason=_reason(r["verdict"], sign, lo, hi, level, r, cfg))
    schema = CELL_SCHEMA | LAYERS_SCHEMA | {"level": pl.Float64, "verdict_cell": pl.String}
    return pl.DataFrame(records, schema=schema)


def family(cells: pl.DataFrame, cfg: dict) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The check table (Holm over the cells' `check` rows) and the sensitivity table (Holm per range)."""
    primary = cfg["measure"]
    chosen = "explicit" if isinstance(cfg["layers"], list | tuple) else cfg["layers"]  # the range reported
    secondary = next(m for m in MEASURES if m != primary)
    keys = ["model", "dataset"]
    cells = cells.sort(keys, maintain_order=True)
    if chosen not in set(cells["range"]):
        raise ValueError(f"pathways.check.layers = {cfg['layers']}: the cells hold {set(cells['range'])}")
    parts = cells.filter(measure=primary).partition_by("range", maintain_order=True, as_dict=True)
    tested = {name: _family(rows, cfg) for (name,), rows in parts.items()}
    sens = pl.concat(tested.values()).select(list(LAYERS_SCHEMA))
    # the secondary measure, per cell and uncorrected: p and the interval at α each side
    sec = cells.filter(range=chosen, measure=secondary)
    n = _floats(sec, "n_samples")
    sd = _floats(sec, "sd")
    mean = _floats(sec, "diff")
    s = verdicts(mean, sd, n, MEASURES[secondary], float(cfg["sesoi"]), cfg["alpha"], correct=False)
    secondary_cols = [pl.lit(secondary).alias("secondary_measure"), pl.col("diff").alias("secondary_diff")]
    secondary_cols += [pl.Series(f"secondary_{k}", s[k]).fill_nan(None) for k in ("low", "high", "p")]
    sec = sec.select(*keys, *secondary_cols)
    means = cells.filter(range=chosen).pivot(on="measure", index=keys, values=["target", "control"])
    short = {"flip_rate": "flip", "delta_p": "delta_p"}
    means = means.rename({f"{v}_{m}": f"{short[m]}_{v}" for m in MEASURES for v in ("target", "control")})
    table = tested[chosen].join(sec, on=keys).join(means, on=keys)
    return table.select([pl.col(k).cast(t) for k, t in CHECK_SCHEMA.items()]), sens


def caption(table: pl.DataFrame, cfg: dict) -> str:
    """The falsification figure's statement of the test: measure, layer range, correction, SESOI."""
    measure = table["measure"][0]
    secondary = table["secondary_measure"][0]
    tested = table["p_holm"].drop_nulls().len()
    sesoi = f"±{table['sesoi'][0]:g} {UNITS[measure]}"
    layers = " / ".join(table["layers"].unique(maintain_order=True))
    return (
        f"Verdict: one-sided paired t-test of the per-sample E_Q − control {NAMES[measure]} (primary;"
        f" {NAMES[secondary]} secondary), averaged over layers {layers} (shaded), Holm over the run's"
        f" {tested} tested cells at α = {cfg['alpha']}; 'holds': the corrected bound excludes 0 in the"
        f" predicted direction; 'does not hold': the corrected CI lies within {sesoi} (SESOI) or excludes 0"
        " the wrong way; otherwise 'inconclusive' (also: too few samples, too little probe signal: a rarer"
        f" answer class below {cfg['min_minority']} samples or {cfg['min_minority_share']:.0%}, probe AUC"
        f" below {cfg['min_auc']})."
    )


def rounded(table: pl.DataFrame) -> pl.DataFrame:
    """The TSV view of a check table: p-values and levels to 3 significant digits, other floats 2 decimals."""
    p = cs.by_name("p_value", "p_holm", "level", "secondary_p", require_all=False)
    return table.with_columns((cs.float() - p).round(2), p.round_sig_figs(3))


def dropped_table(kept: list[tuple], dropped: pl.DataFrame, data_dropped: pl.DataFrame) -> pl.DataFrame:
    """Where the samples went: a count per (model, dataset, reason), 'kept' for kept: (model, dataset, n) per
    pair; dropped: the extraction drops; data_dropped: the drops at loading, which hold for every model."""
    load = data_dropped.group_by("dataset", "reason").agg(pl.col("detail").drop_nulls().first(), n=pl.len())
    kept = pl.DataFrame([(*k, "kept") for k in kept], ["model", "dataset", "n", "reason"], orient="row")
    parts = [
        kept,
        dropped.group_by("model", "dataset", "reason").len("n"),
        load.with_columns(model=pl.lit("(loading, all models)")),
    ]
    table = pl.concat([pl.DataFrame(schema=DROPPED_SCHEMA), *parts], how="diagonal_relaxed")
    return table.select(list(DROPPED_SCHEMA)).cast(DROPPED_SCHEMA).sort("model", "dataset", "reason")
