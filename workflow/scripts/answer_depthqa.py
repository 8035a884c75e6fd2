import polars as pl

from truthflow import jobs, runlog, validate


def main(sm):
    questions = validate.read_parquet(sm.input.data, ["id", "question", "depth"])
    # DepthQA asks for explanations: chat models get the bare question, base models the Q:/A: prompt
    desc = f"answer depthqa {sm.wildcards.model}"
    answers = jobs.answer_table(sm, questions["question"].to_list(), "", desc).drop(
        "prompt_ids", "answer_ids"
    )
    out = pl.concat([questions.select(pl.col("id").alias("qid"), "depth"), answers], how="horizontal")
    out.write_parquet(sm.output[0])


runlog.run(snakemake, main)  # noqa: F821
