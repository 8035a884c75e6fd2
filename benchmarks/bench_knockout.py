"""Times the ΔP sweep (residual streams at the probe position after every layer, clean and knocked out) as a
job runs it: every case on shapes the process has not seen, the first call and the repeat beside it.

Prints: the project's sweep (`engine.run` with a `Resid`, clean + E_Q), the plain reference it must reach (two
masked batched passes with all hidden states, gathered at the probe: the sweep's own limit), the sweep with
the workflow's three control draws (clean + E_Q + 3 controls, against 5/2 x the reference), their ratios, peak
memory, and the naive per-layer loop the one-pass trick replaces (L+1 passes). Each of the three timed cases
has its own sequence lengths (common.fresh_lengths); batch sizes come from the memory plan.

CPU, demo models:                python benchmarks/bench_knockout.py
GPU, random weights, real shape: python benchmarks/bench_knockout.py --shape llama-3.2-1b --n 2048
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from truthflow.engine import Condition, Resid, backend, run  # noqa: E402
from truthflow.engine.batches import pad_batch  # noqa: E402
from truthflow.engine.hooks import LayerMasks, ResidCapture, decoder_layers  # noqa: E402
from truthflow.engine.masks import attention_mask, layer_windows, positions_tensor  # noqa: E402
from truthflow.engine.passes import model_parts  # noqa: E402


def make_case(n: int, length: int, vocab: int, case: int, prefix: int = 0):
    """Variable-length sequences: a shared head of `prefix` tokens (a chat template's header and
    instruction; the demo's SmolLM2 prompts share 40), then length/2 .. length tokens (residue class `case`);
    the probe at the last token, 4 blocked tokens in the first half after the head, and 3 control draws of 4
    other tokens there."""
    rng = np.random.default_rng(case)
    head = rng.integers(3, vocab, size=prefix).tolist()
    lengths = common.fresh_lengths(rng, n, max(16, length // 2), max(16, length), case)
    seqs = [head + rng.integers(3, vocab, size=m).tolist() for m in lengths]
    probe = [len(s) - 1 for s in seqs]
    draws = [rng.permutation(np.arange(2, (len(s) - prefix) // 2))[:16] + prefix for s in seqs]
    blocks = [sorted(d[:4].tolist()) for d in draws]
    controls = [[sorted(d[4 * k : 4 * k + 4].tolist()) for d in draws] for k in (1, 2, 3)]
    return seqs, probe, blocks, controls


@torch.inference_mode()
def two_pass_reference(lm, seqs, probe, blocks, batch):
    """The plain reference: per length-sorted batch, two forward passes (clean mask, knockout mask) with
    output_hidden_states=True, gathered at the probe position and copied to the host once per pass, under the
    same attention setting as the project. Its inputs reach the device as the sweep's do, one copy per tensor
    per batch (never one per row)."""
    base, device, dtype = model_parts(lm.model)  # the input embeddings' device, as the sweep takes it
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    with backend.attention(lm.attention):
        for i in range(0, len(order), batch):
            idx = order[i : i + batch]
            ids, valid = pad_batch([seqs[j] for j in idx], 0, side="right")
            ids, valid = ids.to(device), valid.to(device)
            block = positions_tensor([blocks[j] for j in idx], [ids.shape[1]] * len(idx), ids.shape, device)
            rows = torch.arange(len(idx), device=device)
            pos = torch.tensor([probe[j] for j in idx], device=device)
            for b in (None, block):
                out = base(
                    input_ids=ids,
                    attention_mask=attention_mask(valid, b, dtype),
                    output_hidden_states=True,
                    use_cache=False,
                )
                torch.stack([h[rows, pos] for h in out.hidden_states[1:]], 1).float().cpu()
    common.sync()


@torch.inference_mode()
def naive_loop(lm, seqs, probe, blocks, batch):
    """The per-layer loop: for each k a full pass with the block in layers 1..k (L passes + 1 clean)."""
    layers = decoder_layers(lm.model)
    base, device, dtype = model_parts(lm.model)
    with backend.attention(lm.attention):
        for i in range(0, len(seqs), batch):
            ids, valid = pad_batch(seqs[i : i + batch], 0, side="right")
            ids, valid = ids.to(device), valid.to(device)
            block = positions_tensor(blocks[i : i + batch], [ids.shape[1]] * len(ids), ids.shape, device)
            clean_m, ko_m = attention_mask(valid, None, dtype), attention_mask(valid, block, dtype)
            cap = ResidCapture(layers)
            cap.set_positions(probe[i : i + batch])
            per = LayerMasks(layers, layer_windows(base.config))
            try:
                base(input_ids=ids, attention_mask=clean_m, use_cache=False)
                for k in range(len(layers)):
                    per.masks = {j: (ko_m if j <= k else clean_m) for j in range(len(layers))}
                    base(input_ids=ids, attention_mask=clean_m, use_cache=False)
            finally:
                cap.remove()
                per.remove()
    common.sync()


def bench(lm, label, dims, args):
    vocab = lm.model.config.get_text_config().vocab_size
    plan = common.settings(args, dims, str(lm.model.dtype).removeprefix("torch."))
    n, batch = args.n, plan["batch_size"]
    n_layers = len(decoder_layers(lm.model))
    # three cases, three residue classes of lengths: the project's E_Q sweep, the reference, the project
    # with controls; each is timed on its first call and again on the same inputs
    seqs, probe, blocks, _ = make_case(n, args.length, vocab, 0, args.prefix)
    r_seqs, r_probe, r_blocks, _ = make_case(n, args.length, vocab, 1, args.prefix)
    c_seqs, c_probe, c_blocks, c_controls = make_case(n, args.length, vocab, 2, args.prefix)

    def sweep(s, p, bl, controls=()):
        conds = [Condition(), *(Condition(block=b) for b in (bl, *controls))]
        return run(lm, s, Resid(p), batch, conds, desc=label)

    common.init_device(lm)
    t_first, t_rep, _, _ = common.first_and_repeat(lambda: sweep(seqs, probe, blocks))
    r_first, r_rep, _, _ = common.first_and_repeat(
        lambda: two_pass_reference(lm, r_seqs, r_probe, r_blocks, batch)
    )
    c_first, c_rep, _, _ = common.first_and_repeat(lambda: sweep(c_seqs, c_probe, c_blocks, c_controls))
    shared = f"{n} samples x {args.prefix} shared + {args.length // 2}-{args.length} tokens"
    print(common.header(label, lm, f"{shared}, {n_layers} layers, {plan['line']}"))
    print(common.rate_line("project sweep, clean + E_Q", n, "samples", t_first, t_rep, 40))
    print(common.rate_line("reference, two masked batched passes", n, "samples", r_first, r_rep, 40))
    print(common.rate_line("project sweep, clean + E_Q + 3 controls", n, "samples", c_first, c_rep, 40))
    print(
        f"  ratios to the reference: clean + E_Q {r_first / t_first:.0%} (first calls), {r_rep / t_rep:.0%} "
        f"(repeats); with 3 controls, of 5/2 x the reference, {2.5 * r_first / c_first:.0%} (first calls), "
        f"{2.5 * r_rep / c_rep:.0%} (repeats)"
    )
    if args.naive_n:
        m = min(args.naive_n, n)
        t0 = time.perf_counter()
        naive_loop(lm, seqs[:m], probe[:m], blocks[:m], batch)
        t_naive = (time.perf_counter() - t0) * n / m
        print(
            f"  naive per-layer loop (L+1 passes, after the sweep's shapes): {n / t_naive:9,.1f} samples/s "
            f"(timed on {m} samples)"
        )
    print(f"  peak memory: {common.peak_mb():,.0f} MiB", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape")
    ap.add_argument("--models", nargs="*", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--dtype", default="bfloat16", help="--shape: the weights' dtype")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--length", type=int, default=48)
    ap.add_argument("--naive-n", type=int, default=32)
    ap.add_argument("--prefix", type=int, default=40, help="tokens every sequence shares (a chat header)")
    common.add_settings_args(ap, "rows per batch")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    for lm, label, dims in common.bench_models(args.shape, args.models, args.attention, args.dtype):
        bench(lm, label, dims, args)


if __name__ == "__main__":
    main()
