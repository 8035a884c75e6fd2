import polars as pl

from truthflow import runlog, validate
from truthflow.generation import answer_questions
from truthflow.models import load_model


def main(sm):
    questions = validate.read_parquet(sm.input.data, ["id", "question"])
    lm = load_model(
        sm.input.model,
        sm.params.dtype,
        gpus=sm.resources.gpu,
        threads=sm.resources.get("torch_threads") or sm.threads,
    )
    prompts, out = answer_questions(
        lm,
        questions["question"].to_list(),
        sm.params.chat,
        sm.params.instruction,
        sm.resources.batch_size,
        sm.params.max_new_tokens,
        desc=f"generate {sm.wildcards.model}/{sm.wildcards.dataset}",
        token_budget=sm.params.token_budget,
        max_prompt_tokens=sm.params.max_prompt_tokens,
        chat_template_kwargs=sm.params.chat_template_kwargs,
    )
    df = pl.DataFrame(
        {
            "id": questions["id"],
            "prompt": prompts,
            "answer": [o["answer"] for o in out],
            "prompt_ids": [o["prompt_ids"] for o in out],
            "answer_ids": [o["answer_ids"] for o in out],
            "n_new_tokens": [o["n_new_tokens"] for o in out],
            "prompt_truncated": [o["prompt_truncated"] for o in out],
            "think_stripped": [o["think_stripped"] for o in out],
        },
        schema_overrides={"prompt_ids": pl.List(pl.Int64), "answer_ids": pl.List(pl.Int64)},
    )
    runlog.write_parquet(df, sm.output[0])


runlog.run(snakemake, main)  # noqa: F821
