"""Times generate_answers: new tokens/s and peak memory.

CPU (demo models, real prompts):   python benchmarks/bench_generate.py
GPU (random weights, real shapes): python benchmarks/bench_generate.py --shape llama-3.2-1b --batch 256
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
from common import peak_mb  # noqa: E402

from truthflow.generation import build_prompt, generate_answers  # noqa: E402
from truthflow.models import load_model  # noqa: E402


def run(lm, prompts, batch, max_new, chat, label, encode=None):
    if encode is not None:  # random-weight models: prompts are token-id lists
        import truthflow.generation as g

        g.encode_prompt = lambda tok, p, c: p
    t0 = time.perf_counter()
    out = generate_answers(lm, prompts, batch, max_new, stop_at_newline=False, chat=chat, desc=label)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    n_tok = sum(o["n_new_tokens"] for o in out)
    print(
        f"{label}: {len(prompts)} prompts, batch {batch}, {n_tok} new tokens in {dt:.1f} s = "
        f"{n_tok / dt:,.0f} new tokens/s; peak memory {peak_mb():,.0f} MiB",
        flush=True,
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", help="random-weight model shape (GPU): llama-3.2-1b, qwen3-8b, llama-3-8b")
    ap.add_argument("--models", nargs="*", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    if args.shape:
        from shapes import random_model

        lm = random_model(args.shape)
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(3, 1000, (args.prompt_len,), generator=g).tolist() for _ in range(args.n)]
        # random weights never emit EOS on purpose: every row generates max_new_tokens
        run(lm, [[2] + p for p in prompts], 8, 4, False, "warm-up", encode=True)
        run(lm, [[2] + p for p in prompts], args.batch, args.max_new_tokens, False, args.shape, encode=True)
        return
    questions = pl.read_parquet(Path("results/demo/data/nq.parquet"))["question"].to_list()[: args.n]
    for name in args.models:
        lm = load_model(Path("resources/models") / name, "float32")
        chat = lm.info["chat"]
        prompts = [build_prompt(lm.tokenizer, q, chat) for q in questions]
        run(lm, prompts, args.batch, args.max_new_tokens, chat, f"{name} (cpu)")


if __name__ == "__main__":
    main()
