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


def quantitative(published: pl.DataFrame, pathways: pl.DataFrame, depthwise: pl.DataFrame) -> list[dict]:
    rows = []
    for p in published.iter_rows(named=True):
        rng = f"[{p['low']:g}, {p['high']:g}]"
        if p["kind"] == "delta_p":
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
        else:
            sub = depthwise.filter((pl.col("model") == p["model"]) & (pl.col("depth") == int(p["depth"])))
            if sub.height == 0:
                continue
            value = float(sub["mink"].median())
            detail = f"median depthwise MIN-K%, depth {int(p['depth'])} ({p['source']})"
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
    against the matched random control. Q-Anchored below A-Anchored is not a check: it follows from the
    split (METHOD A9)."""
    rows = []
    for r in check.iter_rows(named=True):
        if r["flip_target"] is None or r["flip_control"] is None:
            detail = f"n = {r['n_samples']} matched samples: {r['reason']}"
            value = None
        else:
            detail = (
                f"flip rate E_Q {r['flip_target']:.1f}% [{r['flip_target_low']:.1f}, "
                f"{r['flip_target_high']:.1f}] vs control {r['flip_control']:.1f}% "
                f"[{r['flip_control_low']:.1f}, "
                f"{r['flip_control_high']:.1f}]; ΔP E_Q {r['delta_p_target']:.1f} vs control "
                f"{r['delta_p_control']:.1f}; n = {r['n_samples']} samples; {r['reason']} "
                "(reproduced = flip-rate difference, points)"
            )
            value = float(r["flip_diff"])
        rows.append(
            _row(
                "E_Q knockout beats random control",
                r["model"],
                r["dataset"],
                detail,
                None,
                None,
                value,
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
    rows = quantitative(published, pathways, depthwise)
    if check is not None:
        rows += qualitative_pathways(check)
    if pooled is not None:
        rows += qualitative_depth(depthwise, pooled)
    return pl.DataFrame(rows, schema=SCHEMA)
