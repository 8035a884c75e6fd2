"""Published vs reproduced: the values read off the papers' figures (workflow/report/published.tsv) next to
this run's, and, for every model, the qualitative checks (E_Q knockout beats the matched random control;
MIN-K% rising with depth), each stated as holds / does not hold / inconclusive."""

from __future__ import annotations

import polars as pl

SCHEMA = {
    "check": pl.String,
    "model": pl.String,
    "dataset": pl.String,
    "detail": pl.String,
    "published": pl.Float64,
    "published_range": pl.String,
    "reproduced": pl.Float64,
    "verdict": pl.String,
}


EXPERIMENT_KINDS = ("patching", "answer_only", "awareness", "detection")


def _row(check, model, dataset, detail, published, rng, reproduced, verdict) -> dict:
    return {
        "check": check,
        "model": model,
        "dataset": dataset,
        "detail": detail,
        "published": published,
        "published_range": rng,
        "reproduced": reproduced,
        "verdict": verdict,
    }


def _experiment_value(p: dict, experiments: dict[str, pl.DataFrame]) -> tuple[float, str] | None:
    """This run's value for a published Section 3.2-5 number (kinds patching, answer_only, awareness,
    detection), or None when the run has no such row (model not run, experiment off, undefined)."""
    key = (pl.col("model") == p["model"]) & (pl.col("dataset") == p["dataset"])
    kind = p["kind"]
    if kind in ("patching", "answer_only"):
        rows = experiments.get("rows")
        if rows is None:
            return None
        cond = "E_Q" if kind == "patching" else "-ΔP"
        sub = rows.filter(
            key
            & (pl.col("experiment") == kind)
            & (pl.col("condition") == cond)
            & (pl.col("group") == p["anchor"])
        ).drop_nulls("value")
        what = "flip rate (%) under E_Q patching" if kind == "patching" else "−ΔP (%) from the answer alone"
        return (float(sub["value"][0]), f"{what}, {p['anchor']} ({p['source']})") if sub.height else None
    if kind == "awareness":
        aw = experiments.get("awareness")
        if aw is None:
            return None
        sub = aw.filter(key).drop_nulls("auc").group_by("layer").agg(pl.col("auc").mean())
        if not sub.height:
            return None
        best = sub.sort(["auc", "layer"], descending=[True, False])
        layer = int(best["layer"][0])
        return 100 * float(
            best["auc"][0]
        ), f"pathway-awareness AUC (%), best layer {layer} ≠ K ({p['source']})"
    if kind == "detection":
        det = experiments.get("detection")
        if det is None:
            return None
        sub = det.filter(key & (pl.col("method") == p["method"])).drop_nulls("auc")
        sub = sub.filter(pl.col("status").str.starts_with("ok"))
        if not sub.height:
            return None
        return 100 * float(
            sub["auc"].mean()
        ), f"{p['method']} test AUC (%), mean of {sub.height} seeds ({p['source']})"
    return None


def quantitative(
    published: pl.DataFrame,
    pathways: pl.DataFrame,
    depthwise: pl.DataFrame,
    experiments: dict[str, pl.DataFrame] | None = None,
) -> list[dict]:
    rows = []
    for p in published.iter_rows(named=True):
        rng = f"[{p['low']:g}, {p['high']:g}]"
        if p["kind"] in EXPERIMENT_KINDS:
            found = _experiment_value(p, experiments or {})
            if found is None:
                continue
            value, detail = found
        elif p["kind"] == "delta_p":
            sub = pathways.filter(
                (pl.col("knockout") == "target")
                & (pl.col("model") == p["model"])
                & (pl.col("anchor") == p["anchor"])
                & (pl.col("layer") == int(p["layer"]))
            )
            if p["dataset"] != "all":
                sub = sub.filter(pl.col("dataset") == p["dataset"])
            if sub.height == 0:
                continue
            value = float(sub["mean_delta_p"].mean())
            detail = f"mean ΔP, {p['anchor']}, layer {int(p['layer'])} ({p['source']})"
        elif p["kind"] == "median_mink":
            sub = depthwise.filter((pl.col("model") == p["model"]) & (pl.col("depth") == int(p["depth"])))
            if sub.height == 0:
                continue
            value = float(sub["mink"].median())
            detail = f"median depthwise MIN-K%, depth {int(p['depth'])} ({p['source']})"
        else:
            raise ValueError(f"published.tsv: unknown kind '{p['kind']}'")
        verdict = "within range" if p["low"] <= value <= p["high"] else "outside range"
        rows.append(
            _row(
                "published value",
                p["model"],
                p["dataset"] or "depthqa",
                detail,
                float(p["published"]),
                rng,
                value,
                verdict,
            )
        )
    return rows


def qualitative_pathways(check: pl.DataFrame) -> list[dict]:
    """One row per (model, dataset) from the falsification check (truthflow.pathways.check): E_Q knockout
    against the matched random control, the primary measure's paired difference, Holm-corrected. Q-Anchored
    below A-Anchored is not a check: it follows from the split (METHOD A9)."""
    rows = []
    for r in check.iter_rows(named=True):
        detail = f"n = {r['n_samples']} matched samples, layers {r['layers']}: {r['reason']}"
        if r["diff_low"] is not None:
            sec = (
                f"{r['secondary_measure']} {r['secondary_diff']:+.2f} [{r['secondary_low']:.2f},"
                f" {r['secondary_high']:.2f}], p = {r['secondary_p']:.3g}"
            )
            detail = (
                f"{r['measure']} E_Q − control {r['diff']:+.2f} [{r['diff_low']:.2f}, {r['diff_high']:.2f}]"
                f" (Holm-corrected), p = {r['p_value']:.3g}, p_holm = {r['p_holm']:.3g},"
                f" SESOI {r['sesoi']:g}, per cell uncorrected: {r['verdict_cell']};"
                f" secondary (uncorrected) {sec}; {detail}"
                f" (reproduced = mean {r['measure']} difference)"
            )
        rows.append(
            _row(
                "E_Q knockout beats random control",
                r["model"],
                r["dataset"],
                detail,
                None,
                None,
                r["diff"],
                r["verdict"],
            )
        )
    return rows


def qualitative_depth(depthwise: pl.DataFrame, pooled: pl.DataFrame) -> list[dict]:
    rows = []
    source = depthwise if depthwise.height else pooled.rename({"median": "mink"})
    for model in source["model"].unique(maintain_order=True).to_list():
        sub = source.filter(pl.col("model") == model)
        med = [sub.filter(pl.col("depth") == d)["mink"].median() for d in (1, 2, 3)]
        if any(m is None for m in med):
            verdict = "undefined (a depth is empty)"
        else:
            verdict = "holds" if med[0] < med[1] < med[2] else "does not hold"
        rows.append(
            _row(
                "MIN-K% rises with depth",
                model,
                "depthqa",
                "median by depth D1/D2/D3: " + " / ".join("-" if m is None else f"{m:.2f}" for m in med),
                None,
                None,
                None if med[2] is None or med[0] is None else float(med[2] - med[0]),
                verdict,
            )
        )
    return rows


def compare(
    published: pl.DataFrame,
    pathways: pl.DataFrame | None,
    depthwise: pl.DataFrame | None,
    pooled: pl.DataFrame | None,
    check: pl.DataFrame | None = None,
    experiments: dict[str, pl.DataFrame] | None = None,
) -> pl.DataFrame:
    pathways = (
        pathways
        if pathways is not None
        else pl.DataFrame(
            schema={
                "model": pl.String,
                "dataset": pl.String,
                "knockout": pl.String,
                "anchor": pl.String,
                "layer": pl.Int64,
                "mean_delta_p": pl.Float64,
            }
        )
    )
    depthwise = (
        depthwise
        if depthwise is not None
        else pl.DataFrame(schema={"model": pl.String, "depth": pl.Int64, "mink": pl.Float64})
    )
    # qualitative checks are stated for every model; paper models also get their published values
    rows = quantitative(published, pathways, depthwise, experiments)
    if check is not None:
        rows += qualitative_pathways(check)
    if pooled is not None:
        rows += qualitative_depth(depthwise, pooled)
    return pl.DataFrame(rows, schema=SCHEMA)
