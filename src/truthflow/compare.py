"""Published vs reproduced: the papers' values (workflow/report/published.tsv) next to this run's, and per
model the qualitative checks (E_Q knockout beats the matched random control; MIN-K% rises with depth)."""

import polars as pl

from .errors import TruthflowError

SCHEMA = {
    "paper": pl.String,
    "kind": pl.String,  # published.tsv's kind, or the qualitative check's (QUALITATIVE)
    "check": pl.String,
    "model": pl.String,
    "dataset": pl.String,
    "detail": pl.String,
    "published": pl.Float64,
    "published_range": pl.String,
    "reproduced": pl.Float64,
    "off_range": pl.Float64,  # reproduced minus the nearest bound of the published range; 0 within it
    "verdict": pl.String,
}
# the DepthQA metrics; `depth`: a mean score's, a discrepancy's deeper one (2: 1-2, 3: 2-3), empty: overall
DEPTH_METRICS = ("mean_score", "forward_discrepancy", "backward_discrepancy")
# published.tsv kind -> the table of this run it is compared with
TABLE_OF_KIND = {
    "delta_p": "pathways",
    "median_mink": "depthwise",
    "patching": "rows",
    "answer_only": "rows",
    "awareness": "awareness",
    "detection": "detection",
    **dict.fromkeys(DEPTH_METRICS, "depth_metrics"),
}
# the bar experiments: the condition compared and what its value is
BARS = {
    "patching": ("E_Q", "flip rate (%) under E_Q patching"),
    "answer_only": ("-ΔP", "−ΔP (%) from the answer alone"),
}
# the qualitative checks: kind -> (paper, check), the papers named as in published.tsv
QUALITATIVE = {
    "eq_vs_control": ("Two Pathways", "E_Q knockout beats random control"),
    "mink_rises": ("DepthQA", "MIN-K% rises with depth"),
}
DEPTH_VERDICTS = {None: "undefined (a depth is empty)", True: "holds", False: "does not hold"}


def reproduced(p: dict, tables: dict[str, pl.DataFrame | None]) -> tuple[float, str] | None:
    """This run's value and description for a published.tsv row; None where the run has no such row."""
    if p["kind"] not in TABLE_OF_KIND:
        raise TruthflowError(f"published.tsv: unknown kind '{p['kind']}' (known: {', '.join(TABLE_OF_KIND)})")
    kind = p["kind"]
    src = p["source"]
    table = tables.get(TABLE_OF_KIND[kind])
    if table is None:
        return None
    sub = table.filter(model=p["model"])
    if p["dataset"] and p["dataset"] != "all":  # DepthQA's rows name no dataset: their tables have none
        sub = sub.filter(pl.col("dataset") == p["dataset"])
    if kind == "delta_p":
        sub = sub.filter(knockout="target", anchor=p["anchor"], layer=p["layer"])
        return sub["mean_delta_p"].mean(), f"mean ΔP, {p['anchor']}, layer {int(p['layer'])} ({src})"
    if kind == "median_mink":
        sub = sub.filter(depth=p["depth"])
        return sub["mink"].median(), f"median depthwise MIN-K%, depth {int(p['depth'])} ({src})"
    if kind in DEPTH_METRICS:  # the row of its metric and depth, which published.tsv and METRICS_SCHEMA share
        sub = sub.filter(pl.col("metric") == kind, pl.col("depth").eq_missing(p["depth"]))
        if sub.height == 0:
            return None
        unit = "questions" if kind == "mean_score" else "counted nodes"
        what = f"{kind.replace('_', ' ')}, {sub['scope'][0]}, n = {sub['n'][0]} {unit}"
        return sub["value"][0], f"{what} ({src})"
    if kind in BARS:
        cond, what = BARS[kind]
        sub = sub.filter(experiment=kind, condition=cond, group=p["anchor"]).drop_nulls("value")
        value = sub["value"][0] if sub.height else None
        return value, f"{what}, {p['anchor']} ({src})"
    if kind == "awareness":
        sub = sub.drop_nulls("auc").group_by("layer").agg(pl.col("auc").mean())
        best = sub.sort(["auc", "layer"], descending=[True, False]).head(1)
        if best.height == 0:
            return None
        return 100 * best["auc"][0], f"pathway-awareness AUC (%), best layer {best['layer'][0]} ≠ K ({src})"
    sub = sub.filter(pl.col("status").str.starts_with("ok"), method=p["method"]).drop_nulls("auc")
    auc = 100 * sub["auc"].mean() if sub.height else None
    return auc, f"{p['method']} test AUC (%), mean of {sub.height} seeds ({src})"


def quantitative(published: pl.DataFrame, tables: dict[str, pl.DataFrame | None]) -> list[tuple]:
    rows = []
    for p in published.iter_rows(named=True):
        value, detail = reproduced(p, tables) or (None, "")
        if value is None:
            continue
        off = min(value - p["low"], 0) + max(value - p["high"], 0)
        verdict = "within range" if off == 0 else "outside range"
        rng = f"[{p['low']:g}, {p['high']:g}]"
        dataset = p["dataset"] or "depthqa"  # DepthQA's rows name no dataset
        row = (p["model"], dataset, detail, p["published"], rng, value, off, verdict)
        rows.append((p["paper"], p["kind"], "published value", *row))
    return rows


def _qualitative(kind: str, model: str, dataset: str, detail: str, value, verdict: str) -> tuple:
    """A qualitative check's row: no published value, `value` as reproduced."""
    paper, check = QUALITATIVE[kind]
    return (paper, kind, check, model, dataset, detail, None, None, value, None, verdict)


def qualitative_pathways(check: pl.DataFrame) -> list[tuple]:
    """Per (model, dataset), the falsification check (truthflow.pathways.check): E_Q knockout vs matched
    random control, Holm-corrected. Q- below A-Anchored is no check: it follows from the split (METHOD A9)."""
    rows = []
    for r in check.iter_rows(named=True):
        detail = f"n = {r['n_samples']} matched samples, layers {r['layers']}: {r['reason']}"
        if r["diff_low"] is not None:
            detail = (
                f"{r['measure']} E_Q − control {r['diff']:+.2f} [{r['diff_low']:.2f}, {r['diff_high']:.2f}]"
                f" (Holm-corrected), p = {r['p_value']:.3g}, p_holm = {r['p_holm']:.3g},"
                f" SESOI {r['sesoi']:g}, per cell uncorrected: {r['verdict_cell']}; secondary (uncorrected)"
                f" {r['secondary_measure']} {r['secondary_diff']:+.2f} [{r['secondary_low']:.2f},"
                f" {r['secondary_high']:.2f}], p = {r['secondary_p']:.3g}; {detail}"
                f" (reproduced = mean {r['measure']} difference)"
            )
        rows.append(_qualitative("eq_vs_control", r["model"], r["dataset"], detail, r["diff"], r["verdict"]))
    return rows


def qualitative_depth(depthwise: pl.DataFrame | None, pooled: pl.DataFrame) -> list[tuple]:
    rows = []
    if depthwise is not None and depthwise.height:
        source = depthwise
    else:
        source = pooled.rename({"median": "mink"})
    for model in source["model"].unique(maintain_order=True).to_list():
        sub = source.filter(model=model)
        med = [sub.filter(pl.col("depth") == d)["mink"].median() for d in (1, 2, 3)]
        rise = None if med[0] is None or med[2] is None else med[2] - med[0]
        rises = None if None in med else med[0] < med[1] < med[2]
        verdict = DEPTH_VERDICTS[rises]
        detail = "median by depth D1/D2/D3: " + " / ".join("-" if m is None else f"{m:.2f}" for m in med)
        rows.append(_qualitative("mink_rises", model, "depthqa", detail, rise, verdict))
    return rows


def compare(published: pl.DataFrame, tables: dict[str, pl.DataFrame | None]) -> pl.DataFrame:
    """Published values of the models that ran, each model's qualitative checks; None tables add no rows."""
    check = tables.get("check")
    pooled = tables.get("pooled")
    rows = quantitative(published, tables)
    if check is not None:
        rows += qualitative_pathways(check)
    if pooled is not None:
        rows += qualitative_depth(tables.get("depthwise"), pooled)
    return pl.DataFrame(rows, schema=SCHEMA, orient="row")
