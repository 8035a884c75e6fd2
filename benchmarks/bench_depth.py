"""Times score_mink (questions/s) and answer_depthqa (new tokens/s) with peak memory, each on its first call
(on shapes the process has not seen: random shapes give the two stages lengths in different residue classes)
and again on the same inputs; the batch size and token budget are the memory plan's (--gpu-mem-gb).

CPU, demo models on the demo DepthQA questions: python benchmarks/bench_depth.py
GPU, random-weight Llama-3-8B shape:            python benchmarks/bench_depth.py --shape llama-3-8b --n 512

A demo model's chat setting is its `chat` in config.yaml (the prepared model's info file holds only what the
weights are).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

import truthflow.depth.mink as mink  # noqa: E402
import truthflow.generation as generation  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def bench(lm, label, dims, texts, prompts, args, chat):
    plan = common.settings(args, dims, str(lm.model.dtype).removeprefix("torch."))
    batch, budget, max_new = plan["batch_size"], plan["token_budget"], args.max_new_tokens
    print(common.header(label, lm, plan["line"]), flush=True)
    t_first, t_rep, _, _ = common.first_and_repeat(
        lambda: mink.score_texts(lm, texts, [10, 20, 30], batch, "min-k%")
    )
    print(
        common.rate_line(f"score_mink {len(texts)} questions", len(texts), "questions", t_first, t_rep),
        flush=True,
    )
    t_first, t_rep, out, _ = common.first_and_repeat(
        lambda: generation.generate_answers(lm, prompts, batch, max_new, not chat, chat, "answer", budget)
    )
    n_tok = sum(o["n_new_tokens"] for o in out)
    name = f"answer_depthqa {len(prompts)} answers, {n_tok} new tokens"
    print(common.rate_line(name, n_tok, "new tokens", t_first, t_rep), flush=True)
    print(f"  peak memory {common.peak_mb():,.0f} MiB", flush=True)


def demo_questions(n: int) -> list[str]:
    """The demo run's DepthQA questions (results/demo/data/depthqa.parquet: `snakemake` builds it)."""
    return pl.read_parquet(REPO / "results" / "demo" / "data" / "depthqa.parquet")["question"].to_list()[:n]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape")
    ap.add_argument("--models", nargs="*", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--dtype", default="bfloat16", help="--shape: the weights' dtype")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    common.add_settings_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    if args.shape:
        rng = np.random.default_rng(0)
        # DepthQA questions: 20-60 tokens; the scored texts and the prompts in two residue classes
        texts, prompts = (
            [
                [2, *rng.integers(3, 1000, size=k - 1).tolist()]
                for k in common.fresh_lengths(rng, args.n, 20, 60, c)
            ]
            for c in (0, 1)
        )
        mink.encode_for_scoring = lambda tok, text: text
        generation.encode_prompt = lambda tok, p, c: p
        for lm, label, dims in common.bench_models(args.shape, [], args.attention, args.dtype):
            bench(lm, label, dims, texts, prompts, args, False)
        return
    questions = demo_questions(args.n)
    config = yaml.safe_load((REPO / "config.yaml").read_text())["models"]
    for lm, label, dims in common.bench_models(None, args.models, args.attention):
        chat = bool(config[label.split()[0]].get("chat", False))
        prompts = [generation.build_prompt(lm.tokenizer, q, chat, instruction="") for q in questions]
        bench(lm, label, dims, questions, prompts, args, chat)


if __name__ == "__main__":
    main()
