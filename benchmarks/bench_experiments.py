"""Times the saliency stage with the Logits-mean/min baseline read off its pass (as extract_experiments runs
it), beside the plain reference it replaced: the same saliency plus the baseline's own clean pass
(`answer_logprobs`). Each is timed as a job meets it, its first call on shapes the process has not seen (the
two paths' sequence lengths lie in different residue classes, common.fresh_lengths), then the repeat on the
same inputs. Prints samples/s of both, the time saved, the largest difference between the two baselines (on
the project's inputs, after the timings), and peak memory. The baseline's pass takes the memory plan's batch
size; saliency the workflow's saliency_batch_size.

CPU, demo models:                python benchmarks/bench_experiments.py
GPU, random weights, real shape: python benchmarks/bench_experiments.py --shape llama-3.2-1b --n 512
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from truthflow.pathways.saliency import saliency  # noqa: E402


def make_case(n: int, length: int, vocab: int, prefix: int, case: int):
    """A shared head of `prefix` tokens, a question, an answer of 4..10 tokens (the whole sequence's length in
    residue class `case`); E_Q two question tokens, E_A the answer's last 1..3 tokens (the demo's shapes)."""
    rng = np.random.default_rng(case)
    head = rng.integers(3, vocab, size=prefix).tolist()
    seqs, starts, eqs, eas = [], [], [], []
    for total in common.fresh_lengths(rng, n, 18, length + 10, case):
        a = int(rng.integers(4, 11))
        q = total - a
        seq = head + rng.integers(3, vocab, size=q + a).tolist()
        start = prefix + q
        seqs.append(seq)
        starts.append(start)
        eqs.append(sorted((prefix + rng.choice(q, size=2, replace=False)).tolist()))
        eas.append(list(range(len(seq) - int(rng.integers(1, 4)), len(seq))))
    return seqs, starts, eqs, eas


def bench(lm, label: str, dims, args) -> None:
    n, batch = args.n, args.batch
    vocab = lm.model.config.get_text_config().vocab_size
    plan = common.plan_settings(dims, str(lm.model.dtype).removeprefix("torch."), args.gpu_mem_gb)
    seqs, starts, eqs, eas = make_case(n, args.length, vocab, args.prefix, 0)
    r_seqs, r_starts, r_eqs, r_eas = make_case(n, args.length, vocab, args.prefix, 1)
    common.init_device(lm)
    t_first, t_rep, got, _ = common.first_and_repeat(lambda: saliency(lm, seqs, starts, eqs, eas, batch))
    r_first, r_rep, _, _ = common.first_and_repeat(
        lambda: (
            saliency(lm, r_seqs, r_starts, r_eqs, r_eas, batch),
            common.answer_logprobs(lm, r_seqs, r_eas, plan["batch_size"]),
        )
    )
    ref = common.answer_logprobs(lm, seqs, eas, plan["batch_size"])
    diff = np.nanmax(np.abs(np.concatenate([got.logit_mean - ref[0], got.logit_min - ref[1]])))
    what = f"{n} samples, saliency batch {batch}, baseline pass batch {plan['batch_size']} "
    print(common.header(label, lm, what + f"(memory plan for {plan['gpu_mem_gb']:.0f} GiB)"))
    print(common.rate_line("project, saliency + baseline from its pass", n, "samples", t_first, t_rep, 44))
    print(common.rate_line("reference, saliency + its own clean pass", n, "samples", r_first, r_rep, 44))
    print(
        f"  saved {1 - t_first / r_first:.0%} (first calls), {1 - t_rep / r_rep:.0%} (repeats); baselines "
        f"differ by at most {diff:.1e}"
    )
    print(f"  peak memory {common.peak_mb():,.0f} MiB")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape")
    ap.add_argument("--models", nargs="*", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--length", type=int, default=24, help="longest question, in tokens")
    ap.add_argument("--dtype", default="bfloat16", help="--shape: the weights' dtype")
    ap.add_argument("--batch", type=int, default=4, help="saliency_batch_size (the schema's default)")
    ap.add_argument(
        "--gpu-mem-gb", type=float, default=None, help="the plan's memory (default: the GPU's, or 80)"
    )
    ap.add_argument("--attention", default="auto", help="engine.backend setting: auto, cudnn, flash, ...")
    ap.add_argument("--prefix", type=int, default=30, help="tokens every sequence shares (a chat header)")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    for lm, label, dims in common.bench_models(args.shape, args.models, args.attention, args.dtype):
        bench(lm, label, dims, args)


if __name__ == "__main__":
    main()
