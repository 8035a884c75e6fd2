import time

import polars as pl

from truthflow import runlog
from truthflow.generation import build_prompt, generate_answers
from truthflow.models import load_model


def main(sm):
    questions = pl.read_parquet(sm.input.data)
    lm = load_model(sm.input.model, sm.params.dtype, gpus=sm.resources.gpu, threads=sm.threads)
    chat = sm.params.chat
    # DepthQA asks for explanations: chat models get the question as is, base models the Q:/A: prompt
    prompts = [build_prompt(lm.tokenizer, q, chat, instruction="") for q in questions["question"]]
    t0 = time.perf_counter()
    out = generate_answers(
        lm,
        prompts,
        sm.resources.batch_size,
        sm.params.max_new_tokens,
        stop_at_newline=not chat,
        chat=chat,
        desc=f"answer depthqa {sm.wildcards.model}",
    )
    dt = time.perf_counter() - t0
    n_tok = sum(o["n_new_tokens"] for o in out)
    print(f"{len(out)} answers, {n_tok} new tokens in {dt:.1f} s ({n_tok / dt:.1f} tokens/s)", flush=True)
    runlog.write_parquet(
        pl.DataFrame(
            {
                "qid": questions["id"],
                "depth": questions["depth"],
                "prompt": prompts,
                "answer": [o["answer"] for o in out],
                "n_new_tokens": [o["n_new_tokens"] for o in out],
            }
        ),
        sm.output[0],
    )


runlog.run(snakemake, main)  # noqa: F821
