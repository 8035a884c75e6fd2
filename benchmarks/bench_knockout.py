"""Times the ΔP sweep (clean + knockout residual streams at the probe position, all layers).

Prints samples/s, the cost relative to one clean forward pass with all hidden states, and peak memory, for
the one-pass cumulative sweep and for the naive per-layer loop it replaces (L+1 passes).

CPU, demo models:                python benchmarks/bench_knockout.py
GPU, random weights, real shape: python benchmarks/bench_knockout.py --shape llama-3.2-1b --n 2048 --batch 256
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
import torch  # noqa: E402
from common import peak_mb, sync  # noqa: E402

from truthflow.knockout import LayerMasks, ResidCapture, decoder_layers, knockout_mask, resid_sweep  # noqa: E402
from truthflow.models import load_model  # noqa: E402


def make_case(n: int, length: int, vocab: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(3, vocab, size=length).tolist() for _ in range(n)]
    probe = [length - 1] * n
    blocks = [sorted(rng.choice(np.arange(2, length // 2), size=4, replace=False).tolist()) for _ in range(n)]
    return seqs, probe, blocks


@torch.inference_mode()
def clean_pass(lm, seqs, batch):
    """Reference cost: one clean forward pass with all hidden states (output_hidden_states=True)."""
    device = next(lm.model.parameters()).device
    for i in range(0, len(seqs), batch):
        ids = torch.tensor(seqs[i : i + batch], device=device)
        lm.model(input_ids=ids, output_hidden_states=True, use_cache=False)
    sync()


@torch.inference_mode()
def naive_loop(lm, seqs, probe, blocks, batch):
    """The per-layer loop: for each k a full pass with the block in layers 1..k (L passes + 1 clean)."""
    model = lm.model
    layers = decoder_layers(model)
    base = getattr(model, model.base_model_prefix)
    dtype = next(model.parameters()).dtype
    device = next(model.parameters()).device
    for i in range(0, len(seqs), batch):
        ids = torch.tensor(seqs[i : i + batch], device=device)
        valid = torch.ones_like(ids, dtype=torch.bool)
        block = torch.zeros_like(valid)
        for r, b in enumerate(blocks[i : i + batch]):
            block[r, b] = True
        clean_m = knockout_mask(valid, torch.zeros_like(block), dtype)
        ko_m = knockout_mask(valid, block, dtype)
        cap = ResidCapture(layers)
        cap.positions = torch.tensor(probe[i : i + batch])
        per = LayerMasks(layers)
        base(input_ids=ids, attention_mask=clean_m, use_cache=False)
        for k in range(len(layers)):
            per.masks = {j: (ko_m if j <= k else clean_m) for j in range(len(layers))}
            base(input_ids=ids, attention_mask=clean_m, use_cache=False)
        cap.remove()
        per.remove()
    sync()


def timed(fn, *a):
    t0 = time.perf_counter()
    fn(*a)
    return time.perf_counter() - t0


def bench(lm, label, n, length, batch, naive_n):
    vocab = lm.model.config.get_text_config().vocab_size
    seqs, probe, blocks = make_case(n, length, vocab)
    clean_pass(lm, seqs[:batch], batch)  # warm-up
    t_clean = timed(clean_pass, lm, seqs, batch)
    t_sweep = timed(lambda: resid_sweep(lm, seqs, probe, blocks, batch, desc=label))
    n_layers = len(decoder_layers(lm.model))
    print(f"{label}: {n} samples x {length} tokens, {n_layers} layers, batch {batch}")
    print(f"  one clean pass (all hidden states): {t_clean:.2f} s = {n / t_clean:,.1f} samples/s")
    print(
        f"  one-pass sweep (clean + knockout):   {t_sweep:.2f} s = {n / t_sweep:,.1f} samples/s "
        f"= {t_sweep / t_clean:.2f}x one clean pass"
    )
    if naive_n:
        m = min(naive_n, n)
        t_naive = timed(naive_loop, lm, seqs[:m], probe[:m], blocks[:m], batch) * n / m
        print(
            f"  naive per-layer loop (L+1 passes):   {t_naive:.2f} s = {n / t_naive:,.1f} samples/s "
            f"= {t_naive / t_clean:.2f}x one clean pass (timed on {m} samples)"
        )
    print(f"  peak memory: {peak_mb():,.0f} MiB", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape")
    ap.add_argument("--models", nargs="*", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--length", type=int, default=48)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--naive-n", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    if args.shape:
        from shapes import random_model

        bench(
            random_model(args.shape),
            f"{args.shape} (random weights, bf16, sdpa)",
            args.n,
            args.length,
            args.batch,
            args.naive_n,
        )
        return
    for name in args.models:
        bench(
            load_model(Path("resources/models") / name, "float32"),
            f"{name} (cpu, fp32)",
            args.n,
            args.length,
            args.batch,
            args.naive_n,
        )


if __name__ == "__main__":
    main()
