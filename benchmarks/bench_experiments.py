"""Times the saliency stage with the Logits-mean/min baseline read off its pass (as extract_experiments runs
it), beside the plain reference it replaced in the same run: the same saliency plus the baseline's own clean
pass (`answer_logprobs`). Prints samples/s of both, the time saved, the largest difference between the two
baselines, and peak memory.

CPU, demo models:                python benchmarks/bench_experiments.py
GPU, random weights, real shape: python benchmarks/bench_experiments.py --shape llama-3.2-1b --n 512
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

from truthflow.pathways.interventions import answer_logprobs  # noqa: E402
from truthflow.pathways.saliency import saliency  # noqa: E402


def make_case(n: int, length: int, vocab: int, prefix: int, seed: int = 0):
    """A shared head of `prefix` tokens, a question, an answer of 4..10 tokens; E_Q two question tokens, E_A
    the answer's last 1..3 tokens (the demo's shapes)."""
    rng = np.random.default_rng(seed)
    head = rng.integers(3, vocab, size=prefix).tolist()
    seqs, starts, eqs, eas = [], [], [], []
    for _ in range(n):
        q, a = int(rng.integers(8, length)), int(rng.integers(4, 11))
        seq = head + rng.integers(3, vocab, size=q + a).tolist()
        start = prefix + q
        seqs.append(seq)
        starts.append(start)
        eqs.append(sorted((prefix + rng.choice(q, size=2, replace=False)).tolist()))
        eas.append(list(range(len(seq) - int(rng.integers(1, 4)), len(seq))))
    return seqs, starts, eqs, eas


def bench(lm, label: str, n: int, length: int, batch: int, prefix: int) -> None:
    seqs, starts, eqs, eas = make_case(n, length, lm.model.config.get_text_config().vocab_size, prefix)
    saliency(lm, seqs[:2], starts[:2], eqs[:2], eas[:2], 2, desc="warm-up")  # both paths warm
    answer_logprobs(lm, seqs[:2], eas[:2], 2, desc="warm-up")

    def timed(fn):
        sync()
        t = time.perf_counter()
        out = fn()
        sync()
        return out, time.perf_counter() - t

    (got, t_project) = timed(lambda: saliency(lm, seqs, starts, eqs, eas, batch))
    (ref, t_ref) = timed(
        lambda: (saliency(lm, seqs, starts, eqs, eas, batch), answer_logprobs(lm, seqs, eas, 2 * batch))
    )
    diff = np.nanmax(np.abs(np.concatenate([got.logit_mean - ref[1][0], got.logit_min - ref[1][1]])))
    print(f"{label}: {n} samples")
    print(f"  project, saliency + baseline from its pass: {n / t_project:7.1f} samples/s ({t_project:.1f} s)")
    print(f"  reference, saliency + its own clean pass:   {n / t_ref:7.1f} samples/s ({t_ref:.1f} s)")
    saved = f"saved {t_ref - t_project:.1f} s ({1 - t_project / t_ref:.0%})"
    print(f"  {saved}; baselines differ by at most {diff:.1e}")
    print(f"  peak memory {peak_mb():,.0f} MiB")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape")
    ap.add_argument("--models", nargs="*", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--length", type=int, default=24, help="longest question, in tokens")
    ap.add_argument("--batch", type=int, default=16, help="saliency_batch_size (the demo's)")
    ap.add_argument("--prefix", type=int, default=30, help="tokens every sequence shares (a chat header)")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    for lm, label in bench_models(args.shape, args.models):
        bench(lm, label, args.n, args.length, args.batch, args.prefix)


if __name__ == "__main__":
    main()
