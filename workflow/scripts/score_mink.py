import polars as pl

from truthflow import jobs, runlog, validate
from truthflow.depth.mink import score_texts


def main(sm):
    questions = validate.read_parquet(sm.input.data, ["id", "question", "depth"])
    texts, desc = questions["question"].to_list(), f"min-k% {sm.wildcards.model}"
    scores = score_texts(jobs.load_job_model(sm), texts, sm.params.k_grid, sm.resources.batch_size, desc=desc)
    out = pl.concat([questions.select(pl.col("id").alias("qid"), "depth"), scores], how="horizontal")
    out.with_columns(pl.lit(sm.wildcards.model).alias("model")).write_parquet(sm.output[0])


runlog.run(snakemake, main)  # noqa: F821
