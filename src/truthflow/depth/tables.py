"""DepthQA tables (METHOD B2, B4, B5): depthwise MIN-K%, score gaps and the memorization split, from long
tables. `per_question_df`: one row per (model, question): model, qid, depth, mink_{k} / minkpp_{k} and score
(the judge's 1–5, null when missing). `nodes_df`: the DepthQA graph (NODE_COLUMNS); empty (no graph), it gives
empty group tables. A group is one D3 node with its ancestors (direct_predecessors), named by `group`."""

import polars as pl

from ..errors import TruthflowError

NODE_COLUMNS = ("nodeid", "group", "depth", "direct_predecessors", "direct_successors", "qid")


# here, not in .mink: the judge-only path (rule released_metrics) reads these tables without torch or the
# engine, and its code inputs list no engine module
def k_label(k: float) -> str:
    """`20` for 20.0, `12.5` for 12.5: the suffix of the mink_/minkpp_ columns."""
    return str(int(k)) if float(k).is_integer() else str(k)


def mink_column(k: float, plus_plus: bool = False) -> str:
    return f"{'minkpp' if plus_plus else 'mink'}_{k_label(k)}"


DEPTHWISE_SCHEMA = {
    "model": pl.Utf8,
    "group": pl.Utf8,
    "d3_node": pl.Utf8,
    "depth": pl.Int64,
    "k": pl.Utf8,
    "mink": pl.Float64,
    "n_questions": pl.Int64,
}
GAP_SCHEMA = {
    "model": pl.Utf8,
    "group": pl.Utf8,
    "d3_node": pl.Utf8,
    "d3_qid": pl.Utf8,
    "d3_score": pl.Float64,
    "d2_mean_score": pl.Float64,
    "n_d2": pl.Int64,
    "gap": pl.Float64,
    "excluded": pl.Utf8,  # why the group has no gap (null: it has one)
}
SPLIT_SCHEMA = {
    "model": pl.Utf8,
    "group": pl.Utf8,
    "subset": pl.Utf8,
    "side": pl.Utf8,
    "gap": pl.Float64,
    "d3_mink": pl.Float64,
    "threshold": pl.Float64,
}
POOLED_SCHEMA = {
    "model": pl.Utf8,
    "depth": pl.Int64,
    "k": pl.Utf8,
    "n": pl.Int64,
    "mean": pl.Float64,
    "std": pl.Float64,
    "median": pl.Float64,
    "q25": pl.Float64,
    "q75": pl.Float64,
}


def require_columns(df: pl.DataFrame, columns: list[str] | tuple[str, ...], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise TruthflowError(f"{what} lacks column(s) {missing} (has {df.columns})")


def node_records(nodes_df: pl.DataFrame) -> dict[str, dict]:
    """nodeid → node, of a graph data.load_depthqa has checked (closed, one D3 per group)."""
    if nodes_df.height == 0:
        return {}
    require_columns(nodes_df, NODE_COLUMNS, "nodes table")
    return {rec["nodeid"]: rec for rec in nodes_df.select(NODE_COLUMNS).iter_rows(named=True)}


def group_members(nodes_df: pl.DataFrame) -> pl.DataFrame:
    """One row per (group, node): every D3 node with its ancestors, found through direct_predecessors."""
    nodes = node_records(nodes_df)
    rows = []
    for d3, rec in nodes.items():
        if rec["depth"] != 3:
            continue
        seen = {d3}
        stack = [d3]
        while stack:  # the seen set also keeps a cyclic (broken) graph from looping
            new = set(nodes[stack.pop()]["direct_predecessors"]) - seen
            seen |= new
            stack.extend(new)
        rows += [(rec["group"], d3, n, nodes[n]["depth"], nodes[n]["qid"]) for n in sorted(seen)]
    schema = {"group": pl.Utf8, "d3_node": pl.Utf8, "nodeid": pl.Utf8, "depth": pl.Int64, "qid": pl.Utf8}
    return pl.DataFrame(rows, schema=schema, orient="row")


def depthwise_average(per_question_df: pl.DataFrame, nodes_df: pl.DataFrame, k: float) -> pl.DataFrame:
    """Per (model, group, depth): the mean mink_{k} of the group's questions there, a shared one once."""
    col = mink_column(k)
    members = group_members(nodes_df)
    if members.height == 0:
        return pl.DataFrame(schema=DEPTHWISE_SCHEMA)
    require_columns(per_question_df, ["model", "qid", col], "per-question table")
    scores = per_question_df.select("model", "qid", pl.col(col).cast(pl.Float64))
    per_group = members.select("group", "d3_node", "depth", "qid").unique()
    return (
        per_group.join(scores, on="qid", how="inner")
        .group_by("model", "group", "d3_node", "depth")
        .agg(pl.col(col).mean().alias("mink"), pl.col(col).count().alias("n_questions"))
        .with_columns(pl.lit(k_label(k)).alias("k"))
        .select(list(DEPTHWISE_SCHEMA))
        .cast(DEPTHWISE_SCHEMA)
        .sort("model", "group", "depth")
    )


def d3_mink_by_group(depthwise_df: pl.DataFrame) -> pl.DataFrame:
    """model, group, mink of the group's D3 question: the input of memorization_split."""
    return depthwise_df.filter(pl.col("depth") == 3).select("model", "group", "mink")


def score_gaps(per_question_df: pl.DataFrame, nodes_df: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Per (model, group): the score gap (METHOD B4) or null and why (`excluded`); and the excluded count."""
    nodes = node_records(nodes_df)
    if not nodes:
        return pl.DataFrame(schema=GAP_SCHEMA), 0
    require_columns(per_question_df, ["model", "qid", "score"], "per-question table")
    rows = []
    for (model,), scores in sorted(per_question_df.group_by("model")):
        score_of = dict(scores.filter(pl.col("score").is_not_null()).select("qid", "score").iter_rows())
        for d3, rec in sorted(nodes.items()):
            if rec["depth"] != 3:
                continue
            d2_parents = [p for p in rec["direct_predecessors"] if nodes[p]["depth"] == 2]
            d2_qids = sorted({nodes[p]["qid"] for p in d2_parents})
            d3_score = score_of.get(rec["qid"])
            d2_scores = [score_of[q] for q in d2_qids if q in score_of]
            missing_d2 = [q for q in d2_qids if q not in score_of]
            if not d2_qids:
                reason = "no D2 predecessor"
            elif d3_score is None:
                reason = f"D3 score missing ({rec['qid']})"
            elif missing_d2:
                reason = f"D2 score missing ({', '.join(missing_d2)})"
            else:
                reason = None
            d2_mean = sum(d2_scores) / len(d2_scores) if d2_scores else None
            gap = (d3_score - d2_mean) / 4 if reason is None else None
            rows.append((model, rec["group"], d3, rec["qid"], d3_score, d2_mean, len(d2_qids), gap, reason))
    gaps = pl.DataFrame(rows, schema=GAP_SCHEMA, orient="row")
    return gaps, int(gaps["excluded"].is_not_null().sum())


def memorization_split(
    gaps_df: pl.DataFrame, d3_mink_by_group: pl.DataFrame, lower_q: float = 0.25, upper_q: float = 0.75
) -> pl.DataFrame:
    """Per model, long, over groups with a gap: "25%" = D3 MIN-K% ≤ its lower_q quantile, "75%" ≥ upper_q."""
    if not 0 <= lower_q < upper_q <= 1:
        raise TruthflowError(
            f"memorization split quantiles must satisfy 0 ≤ lower ({lower_q}) < upper ({upper_q}) ≤ 1"
        )
    require_columns(d3_mink_by_group, ["model", "group", "mink"], "D3 MIN-K% table")
    if gaps_df.height == 0:
        return pl.DataFrame(schema=SPLIT_SCHEMA)
    d3 = d3_mink_by_group.select("model", "group", pl.col("mink").alias("d3_mink")).drop_nulls("d3_mink")
    joined = gaps_df.filter(pl.col("gap").is_not_null()).join(d3, on=["model", "group"])
    mink = pl.col("d3_mink")
    threshold = pl.col("threshold")
    sides = (("lower", lower_q, mink <= threshold), ("upper", upper_q, mink >= threshold))
    parts = []
    for side, q, keep in sides:
        model_quantile = mink.quantile(q, interpolation="linear").over("model")
        kept = joined.with_columns(model_quantile.alias("threshold")).filter(keep)
        parts.append(kept.with_columns(pl.lit(f"{q * 100:g}%").alias("subset"), pl.lit(side).alias("side")))
    return pl.concat(parts).select(list(SPLIT_SCHEMA)).cast(SPLIT_SCHEMA).sort("model", "side", "group")


def pooled_by_depth(per_question_df: pl.DataFrame, k: float) -> pl.DataFrame:
    """Per (model, depth) over all questions, no graph needed: n, mean, std, median, quartiles of MIN-K%."""
    col = mink_column(k)
    require_columns(per_question_df, ["model", "qid", "depth", col], "per-question table")
    value = pl.col(col).cast(pl.Float64)
    stats = {
        "n": value.count(),
        "mean": value.mean(),
        "std": value.std(),
        "median": value.median(),
        "q25": value.quantile(0.25, interpolation="linear"),
        "q75": value.quantile(0.75, interpolation="linear"),
    }
    return (
        per_question_df.group_by("model", "depth")
        .agg(**stats)
        .with_columns(pl.lit(k_label(k)).alias("k"))
        .select(list(POOLED_SCHEMA))
        .cast(POOLED_SCHEMA)
        .sort("model", "depth")
    )
