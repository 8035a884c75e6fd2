import time

import polars as pl

from truthflow import jobs, runlog, validate
from truthflow.depth.mink import score_texts


def main(sm):
    questions = validate.read_parquet(sm.input.data, ["id", "question", "depth"])
    lm = jobs.load_job_model(sm)
    t0 = time.perf_counter()
    scores = score_texts(
        lm,
        questions["question"].to_list(),
        sm.params.k_grid,
        sm.resources.batch_size,
        desc=f"min-k% {sm.wildcards.model}",
    )
    dt = time.perf_counter() - t0
    print(f"{questions.height} questions in {dt:.1f} s ({questions.height / dt:.1f} questions/s)", flush=True)
    out = pl.concat(
        [questions.select(pl.col("id").alias("qid"), "depth"), scores.drop("index")], how="horizontal"
    )
    out.with_columns(pl.lit(sm.wildcards.model).alias("model")).write_parquet(sm.output[0])


runlog.run(snakemake, main)  # noqa: F821
