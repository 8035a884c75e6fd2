"""Times the ΔP sweep (clean + knockout residual streams at the probe position, all layers), cold, on
variable-length inputs.

Prints, from the same run: the project's sweep (clean + E_Q knockout, and clean + E_Q + 3 control draws as the
workflow runs it), the plain reference it must approach (two masked batched forward passes with all hidden
states, gathered at the probe position: the sweep's own limit), the ratio, peak memory, and the naive
per-layer loop the one-pass trick replaces (L+1 passes).

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
from common import bench_models, peak_mb, sync  # noqa: E402

from truthflow.batching import pad_batch  # noqa: E402
from truthflow.pathways.knockout import (  # noqa: E402
    LayerMasks,
    ResidCapture,
    decoder_layers,
    knockout_mask,
    layer_windows,
    model_parts,
    positions_tensor,
    resid_sweep_multi,
)


def make_case(n: int, length: int, vocab: int, seed: int = 0, prefix: int = 0):
    """Variable-length sequences: a shared head of `prefix` tokens (a chat template's header and
    instruction; the demo's SmolLM2 prompts share 40), then length/2 .. length tokens; the probe at the last
    token, 4 blocked tokens in the first half after the head."""
    rng = np.random.default_rng(seed)
    head = rng.integers(3, vocab, size=prefix).tolist()
    lengths = rng.integers(max(12, length // 2), length + 1, size=n)
    seqs = [head + rng.integers(3, vocab, size=int(m)).tolist() for m in lengths]
    probe = [len(s) - 1 for s in seqs]
    blocks = [
        sorted((prefix + rng.choice(np.arange(2, (len(s) - prefix) // 2), size=4, replace=False)).tolist())
        for s in seqs
    ]
    return seqs, probe, blocks


@torch.inference_mode()
def two_pass_reference(lm, seqs, probe, blocks, batch):
    """The plain reference: per length-sorted batch, two forward passes (clean mask, knockout mask) with
    output_hidden_states=True, gathered at the probe position and copied to the host once per pass. Its
    inputs reach the device as the sweep's do, one copy per tensor per batch (never one per row)."""
    base, device, dtype, _ = model_parts(lm)  # the input embeddings' device, as the sweep takes it
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    for i in range(0, len(order), batch):
        idx = order[i : i + batch]
        ids, valid = pad_batch([seqs[j] for j in idx], 0, side="right")
        ids, valid = ids.to(device), valid.to(device)
        block = positions_tensor([blocks[j] for j in idx], [ids.shape[1]] * len(idx), ids.shape, device)
        rows = torch.arange(len(idx), device=device)
        pos = torch.tensor([probe[j] for j in idx], device=device)
        for b in (torch.zeros_like(block), block):
            out = base(
                input_ids=ids,
                attention_mask=knockout_mask(valid, b, dtype),
                output_hidden_states=True,
                use_cache=False,
            )
            torch.stack([h[rows, pos] for h in out.hidden_states[1:]], 1).float().cpu()
    sync()


@torch.inference_mode()
def naive_loop(lm, seqs, probe, blocks, batch):
    """The per-layer loop: for each k a full pass with the block in layers 1..k (L passes + 1 clean)."""
    model = lm.model
    layers = decoder_layers(model)
    base, device, dtype, _ = model_parts(lm)
    for i in range(0, len(seqs), batch):
        ids, valid = pad_batch(seqs[i : i + batch], 0, side="right")
        ids, valid = ids.to(device), valid.to(device)
        block = positions_tensor(blocks[i : i + batch], [ids.shape[1]] * len(ids), ids.shape, device)
        clean_m = knockout_mask(valid, torch.zeros_like(block), dtype)
        ko_m = knockout_mask(valid, block, dtype)
        cap = ResidCapture(layers)
        cap.set_positions(probe[i : i + batch])
        per = LayerMasks(layers, layer_windows(base.config))
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


def bench(lm, label, n, length, batch, naive_n, prefix=0):
    vocab = lm.model.config.get_text_config().vocab_size
    seqs, probe, blocks = make_case(n, length, vocab, prefix=prefix)
    n_layers = len(decoder_layers(lm.model))
    # both paths warm first, on one batch: on a GPU the first passes pay kernel selection and the allocator's
    # growth (a cold sweep timed first measured 33% of a warm reference on an H200, 120% once warm)
    warm = slice(0, min(batch, n))
    resid_sweep_multi(lm, seqs[warm], probe[warm], [blocks[warm]] * 4, batch, desc=f"{label} warm-up")
    two_pass_reference(lm, seqs[warm], probe[warm], blocks[warm], batch)
    t_sweep = timed(lambda: resid_sweep_multi(lm, seqs, probe, [blocks], batch, desc=label))
    t_ref = timed(two_pass_reference, lm, seqs, probe, blocks, batch)
    controls = [blocks] * 3
    t_full = timed(lambda: resid_sweep_multi(lm, seqs, probe, [blocks, *controls], batch, desc=label))
    t_ref_full = t_ref * 5 / 2  # the reference scaled to clean + 4 knockout passes
    print(
        f"{label}: {n} samples x {prefix} shared + {length // 2}-{length} tokens, {n_layers} layers, "
        f"batch {batch}"
    )
    print(
        f"  project sweep, clean + E_Q:              {t_sweep:7.2f} s = {n / t_sweep:9,.1f} samples/s"
        f"   ({t_ref / t_sweep:.0%} of the reference)"
    )
    print(f"  reference, two masked batched passes:    {t_ref:7.2f} s = {n / t_ref:9,.1f} samples/s")
    print(
        f"  project sweep, clean + E_Q + 3 controls: {t_full:7.2f} s = {n / t_full:9,.1f} samples/s"
        f"   ({t_ref_full / t_full:.0%} of 5/2 x the reference)"
    )
    if naive_n:
        m = min(naive_n, n)
        t_naive = timed(naive_loop, lm, seqs[:m], probe[:m], blocks[:m], batch) * n / m
        print(
            f"  naive per-layer loop (L+1 passes):       {t_naive:7.2f} s = {n / t_naive:9,.1f} samples/s "
            f"(timed on {m} samples)"
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
    ap.add_argument("--prefix", type=int, default=40, help="tokens every sequence shares (a chat header)")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    for lm, label in bench_models(args.shape, args.models):
        bench(lm, label, args.n, args.length, args.batch, args.naive_n, args.prefix)


if __name__ == "__main__":
    main()
