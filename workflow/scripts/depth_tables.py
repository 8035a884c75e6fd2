import polars as pl

from truthflow import runlog, validate
from truthflow.depth import metrics, prompts, tables

SCORE_COLUMNS = ["model", "qid", "score", "score_sd", "n_judgments", "n_unparseable", "judgments", "reason"]


def main(sm):
    nodes = validate.read_parquet(sm.input.nodes, list(tables.NODE_COLUMNS))
    mink = pl.concat(
        [validate.read_parquet(p, ["model", "qid", "depth"]) for p in sm.input.mink], how="diagonal_relaxed"
    )
    scores = pl.concat(
        [validate.read_parquet(p, SCORE_COLUMNS).select(SCORE_COLUMNS) for p in sm.input.scores]
    )
    per_question = mink.join(scores, on=["model", "qid"], how="left")
    k, m = sm.params.k_plot, sm.params.memorization
    depthwise = tables.depthwise_average(per_question, nodes, k)
    gaps, excluded = tables.score_gaps(per_question, nodes)
    d3_mink = tables.d3_mink_by_group(depthwise)
    subsets = tables.memorization_split(gaps, d3_mink, m["lower_quantile"], m["upper_quantile"])
    pooled = tables.pooled_by_depth(per_question, k)
    mc = sm.params.metrics
    authors = metrics.depth_metrics(per_question, nodes, mc["unparseable"], mc["n_boot"], mc["seed"])
    keys = sm.params.prompt_keys
    files = {stage: (keys[stage], sm.input[f"{stage}_prompt"]) for stage in ("answer", "judge")}
    digests = pl.DataFrame(prompts.digest_rows(files, sm.params.judge_backend))
    print(f"{nodes['group'].n_unique()} groups; {excluded} excluded from the score gap", flush=True)
    if excluded:
        print(gaps.filter(pl.col("excluded").is_not_null()).group_by("excluded").len(), flush=True)
    with pl.Config(tbl_rows=60, tbl_width_chars=200, fmt_str_lengths=70):
        print(pooled, authors.drop("ci_low", "ci_high", "unparseable"), digests, sep="\n", flush=True)
    per_question.write_parquet(sm.output.per_question)
    depthwise.write_parquet(sm.output.depthwise)
    gaps.write_parquet(sm.output.gaps)
    subsets.write_parquet(sm.output.subsets)
    pooled.write_csv(sm.output.pooled, separator="\t")
    authors.write_parquet(sm.output.metrics)
    authors.write_csv(sm.output.metrics_tsv, separator="\t")
    digests.write_csv(sm.output.prompts, separator="\t")


runlog.run(snakemake, main)  # noqa: F821
