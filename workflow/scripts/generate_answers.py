import time

import polars as pl

from truthflow import runlog
from truthflow.generation import build_prompt, generate_answers
from truthflow.models import load_model


def main(sm):
    questions = pl.read_parquet(sm.input.data)
    lm = load_model(sm.input.model, sm.params.dtype, gpus=sm.resources.gpu, threads=sm.threads)
    chat = sm.params.chat
    prompts = [build_prompt(lm.tokenizer, q, chat, sm.params.instruction) for q in questions["question"]]
    t0 = time.perf_counter()
    out = generate_answers(
        lm,
        prompts,
        sm.resources.batch_size,
        sm.params.max_new_tokens,
        stop_at_newline=not chat,
        chat=chat,
        desc=f"generate {sm.wildcards.model}/{sm.wildcards.dataset}",
    )
    dt = time.perf_counter() - t0
    n_tok = sum(o["n_new_tokens"] for o in out)
    print(
        f"{len(out)} answers, {n_tok} new tokens in {dt:.1f} s ({n_tok / dt:.1f} tokens/s) on {lm.device}",
        flush=True,
    )
    df = pl.DataFrame(
        {
            "id": questions["id"],
            "prompt": prompts,
            "answer": [o["answer"] for o in out],
            "prompt_ids": [o["prompt_ids"] for o in out],
            "answer_ids": [o["answer_ids"] for o in out],
            "n_new_tokens": [o["n_new_tokens"] for o in out],
        },
        schema_overrides={"prompt_ids": pl.List(pl.Int64), "answer_ids": pl.List(pl.Int64)},
    )
    runlog.write_parquet(df, sm.output[0])


runlog.run(snakemake, main)  # noqa: F821
