"""Times score_mink (questions/s) and answer_depthqa (new tokens/s) with peak memory.

CPU, demo models on the demo DepthQA questions: python benchmarks/bench_depth.py
GPU, random-weight Llama-3-8B shape:            python benchmarks/bench_depth.py --shape llama-3-8b --n 512

A demo model's chat setting is its `chat` in config.yaml (the prepared model's info file holds only what the
weights are).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import polars as pl  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from common import peak_mb  # noqa: E402

import truthflow.depth.mink as mink  # noqa: E402
import truthflow.generation as generation  # noqa: E402
from truthflow.models import load_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def bench(lm, label, texts, prompts, batch, max_new, chat):
    t0 = time.perf_counter()
    mink.score_texts(lm, texts, [10, 20, 30], batch, desc=f"min-k% {label}")
    dt = time.perf_counter() - t0
    print(
        f"{label}: score_mink {len(texts)} questions in {dt:.1f} s = {len(texts) / dt:,.1f} questions/s; "
        f"peak {peak_mb():,.0f} MiB",
        flush=True,
    )
    t0 = time.perf_counter()
    out = generation.generate_answers(
        lm, prompts, batch, max_new, stop_at_newline=not chat, chat=chat, desc=f"answer {label}"
    )
    dt = time.perf_counter() - t0
    n_tok = sum(o["n_new_tokens"] for o in out)
    print(
        f"{label}: answer_depthqa {len(prompts)} answers, {n_tok} new tokens in {dt:.1f} s = "
        f"{n_tok / dt:,.1f} new tokens/s; peak {peak_mb():,.0f} MiB",
        flush=True,
    )


def demo_questions(n: int) -> list[str]:
    """The demo run's DepthQA questions (results/demo/data/depthqa.parquet: `snakemake` builds it)."""
    return pl.read_parquet(REPO / "results" / "demo" / "data" / "depthqa.parquet")["question"].to_list()[:n]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape")
    ap.add_argument("--models", nargs="*", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    if args.shape:
        from shapes import random_model

        lm = random_model(args.shape)
        g = torch.Generator().manual_seed(0)
        ids = [[2] + torch.randint(3, 1000, (40,), generator=g).tolist() for _ in range(args.n)]
        mink.encode_for_scoring = lambda tok, text: text
        generation.encode_prompt = lambda tok, p, c: p
        bench(lm, args.shape, ids, ids, args.batch, args.max_new_tokens, False)
        return
    questions = demo_questions(args.n)
    config = yaml.safe_load((REPO / "config.yaml").read_text())["models"]
    for name in args.models:
        lm = load_model(REPO / "resources" / "models" / name, "float32")
        chat = bool(config[name].get("chat", False))
        prompts = [generation.build_prompt(lm.tokenizer, q, chat, instruction="") for q in questions]
        bench(lm, f"{name} (cpu)", questions, prompts, args.batch, args.max_new_tokens, chat)


if __name__ == "__main__":
    main()
