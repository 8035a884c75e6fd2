import polars as pl

from truthflow import runlog, validate
from truthflow.depth import metrics, prompts, tables


def main(sm):
    nodes = validate.read_parquet(sm.input.nodes, list(tables.NODE_COLUMNS))
    columns = ["model", "qid", "depth", "judgments"]
    scores = pl.concat([validate.read_parquet(p, columns).select(columns) for p in sm.input.scores])
    mc = sm.params.metrics
    table = metrics.depth_metrics(scores, nodes, mc["unparseable"], mc["n_boot"], mc["seed"])
    files = {"judge": (sm.params.prompt_key, sm.input.judge_prompt)}
    digests = pl.DataFrame(prompts.digest_rows(files, sm.params.judge_backend))
    with pl.Config(tbl_rows=60, tbl_width_chars=200, fmt_str_lengths=70):
        print(table.drop("ci_low", "ci_high", "unparseable"), digests, sep="\n", flush=True)
    table.write_parquet(sm.output.metrics)
    table.write_csv(sm.output.metrics_tsv, separator="\t")
    digests.write_csv(sm.output.prompts, separator="\t")


runlog.run(snakemake, main)  # noqa: F821
