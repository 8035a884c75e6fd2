import polars as pl

from truthflow import runlog, validate
from truthflow.depth import tables


def main(sm):
    nodes = validate.read_parquet(sm.input.nodes, list(tables.NODE_COLUMNS))
    mink = pl.concat(
        [validate.read_parquet(p, ["model", "qid", "depth"]) for p in sm.input.mink], how="diagonal_relaxed"
    )
    score_columns = ["model", "qid", "score", "reason"]
    scores = pl.concat(
        [validate.read_parquet(p, score_columns).select(score_columns) for p in sm.input.scores]
    )
    per_question = mink.join(scores, on=["model", "qid"], how="left")
    k, m = sm.params.k_plot, sm.params.memorization
    depthwise = tables.depthwise_average(per_question, nodes, k)
    gaps, excluded = tables.score_gaps(per_question, nodes)
    d3_mink = tables.d3_mink_by_group(depthwise)
    subsets = tables.memorization_split(gaps, d3_mink, m["lower_quantile"], m["upper_quantile"])
    pooled = tables.pooled_by_depth(per_question, k)
    print(f"{nodes['group'].n_unique()} groups; {excluded} excluded from the score gap", flush=True)
    if excluded:
        print(gaps.filter(pl.col("excluded").is_not_null()).group_by("excluded").len(), flush=True)
    print(pooled, flush=True)
    per_question.write_parquet(sm.output.per_question)
    depthwise.write_parquet(sm.output.depthwise)
    gaps.write_parquet(sm.output.gaps)
    subsets.write_parquet(sm.output.subsets)
    pooled.write_csv(sm.output.pooled, separator="\t")


runlog.run(snakemake, main)  # noqa: F821
