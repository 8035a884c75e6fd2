import polars as pl

from truthflow import runlog, validate
from truthflow.depth.judge import judge_all, sampled


def main(sm):
    answers = validate.read_parquet(sm.input.answers, ["qid", "answer", "depth"])
    data = validate.read_parquet(sm.input.data, ["id", "question", "reference_answer"])
    validate.check_ids(answers, sm.input.answers, "qid", data["id"], sm.input.data)
    questions = data.select(
        pl.col("id").alias("qid"), "question", pl.col("reference_answer").alias("reference")
    )
    rows = answers.join(questions, on="qid").select("qid", "question", "answer", "reference").to_dicts()
    scores = judge_all(
        rows, sm.params.judge, sm.params.cache, generation_backend=sm.params.generation_backend
    )
    missing, cached = scores.filter(pl.col("score").is_null()), int(scores["cached"].sum())
    print(f"{scores.height} verdicts ({cached} from cache), {missing.height} missing", flush=True)
    if missing.height:
        print(missing.group_by("reason").len(), flush=True)
        if sampled(sm.params.judge):  # a draw that did not parse is a draw: cached, counted by the metrics
            print("unparseable sampled verdicts are cached draws (depth.metrics.unparseable)", flush=True)
        else:
            print("missing verdicts are not cached: --forcerun judge_answers asks for them again", flush=True)
    out = scores.join(answers.select("qid", "depth"), on="qid", how="left")
    out.with_columns(pl.lit(sm.wildcards.model).alias("model")).write_parquet(sm.output[0])


# vLLM spawns its engine process, which imports this file again: only the job itself runs main
if __name__ == "__main__":
    runlog.run(snakemake, main)  # noqa: F821
