import polars as pl

from truthflow import runlog, validate
from truthflow.depth.tables import (
    d3_mink_by_group,
    depthwise_average,
    memorization_split,
    pooled_by_depth,
    score_gaps,
)


def main(sm):
    nodes = validate.read_parquet(
        sm.input.nodes, ["nodeid", "group", "depth", "direct_predecessors", "direct_successors", "qid"]
    )
    mink = pl.concat(
        [validate.read_parquet(p, ["model", "qid", "depth"]) for p in sm.input.mink], how="diagonal_relaxed"
    )
    score_columns = ["model", "qid", "score", "reason"]
    scores = pl.concat(
        [validate.read_parquet(p, score_columns).select(score_columns) for p in sm.input.scores]
    )
    per_question = mink.join(scores, on=["model", "qid"], how="left")
    k = sm.params.k_plot
    depthwise = depthwise_average(per_question, nodes, k)
    gaps, excluded = score_gaps(per_question, nodes)
    m = sm.params.memorization
    subsets = memorization_split(gaps, d3_mink_by_group(depthwise), m["lower_quantile"], m["upper_quantile"])
    pooled = pooled_by_depth(per_question, k)
    print(
        f"{nodes['group'].n_unique() if nodes.height else 0} groups; {excluded} excluded from the score gap",
        flush=True,
    )
    if excluded:
        print(gaps.filter(pl.col("excluded").is_not_null()).group_by("excluded").len(), flush=True)
    print(pooled, flush=True)
    runlog.write_parquet(per_question, sm.output.per_question)
    runlog.write_parquet(depthwise, sm.output.depthwise)
    runlog.write_parquet(gaps, sm.output.gaps)
    runlog.write_parquet(subsets, sm.output.subsets)
    runlog.write_tsv(pooled, sm.output.pooled)


runlog.run(snakemake, main)  # noqa: F821
