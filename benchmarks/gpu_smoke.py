"""GPU smoke check: every model stage once, in bf16, on random weights of a real shape, plus exactness.

    python benchmarks/gpu_smoke.py --shape llama-3.2-1b        # on a GPU (about a minute)
    python benchmarks/gpu_smoke.py --shape tiny --dtype float32 # anywhere, CPU included (seconds)

Stages: generation (generate_answers, dynamic cache, var-len prompts), extraction with knockout (the one-pass
sweep with E_Q and three matched control draws), probes (cross-fitted, per-layer, with the falsification
check), MIN-K% statistics (the batched scoring path), and the HF judge's generation path (a judge prompt
decoded greedily). The one-pass knockout is compared with the naive per-layer reference (a pass per layer with
the block in layers 1..k) within a tolerance for the dtype. Exit status 1 when any stage fails.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
import numpy as np  # noqa: E402
import torch  # noqa: E402
from shapes import SHAPES, random_model  # noqa: E402

from truthflow.depth.mink import batch_token_statistics  # noqa: E402
from truthflow.pathways.check import check  # noqa: E402
from truthflow.pathways.knockout import per_layer_reference, resid_sweep_multi  # noqa: E402
from truthflow.pathways.probes import run_probes  # noqa: E402

# relative tolerance of one-pass vs per-layer knockout: float32 is exact to rounding; bf16 has 8 mantissa bits
TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def case(n: int, vocab: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(3, vocab, size=int(m)).tolist() for m in rng.integers(24, 64, size=n)]
    probe = [len(s) - 1 for s in seqs]
    question = [list(range(1, len(s) // 2)) for s in seqs]
    eq = [sorted(rng.choice(q, size=3, replace=False).tolist()) for q in question]
    controls = [
        [
            sorted(rng.choice(sorted(set(q) - set(e)), size=3, replace=False).tolist())
            for q, e in zip(question, eq, strict=True)
        ]
        for _ in range(3)
    ]
    return seqs, probe, eq, controls


def stage_generation(lm, n: int):
    from truthflow.generation import generate_answers

    vocab = lm.model.config.vocab_size
    rng = np.random.default_rng(1)
    prompts = [[2] + rng.integers(3, vocab, size=int(m)).tolist() for m in rng.integers(8, 48, size=n)]
    out = generate_answers(
        lm, [""] * n, batch_size=n, max_new_tokens=16, stop_at_newline=False, chat=False, prompt_ids=prompts
    )
    tokens = sum(o["n_new_tokens"] for o in out)
    assert len(out) == n and tokens > 0
    return f"{n} var-len prompts, {tokens} new tokens"


def stage_extraction(lm, n: int, dtype: str):
    vocab = lm.model.config.vocab_size
    seqs, probe, eq, controls = case(n, vocab)
    clean, kos = resid_sweep_multi(lm, seqs, probe, [eq, *controls], batch_size=64, out_dtype=np.float32)
    sync()
    worst = 0.0
    for i in range(3):  # exactness: one-pass cumulative knockout vs the per-layer reference passes
        ref_clean, ref_ko = per_layer_reference(lm, seqs[i], probe[i], eq[i])
        for k in range(ref_ko.shape[0]):
            scale = max(np.abs(ref_ko[k]).max(), 1e-6)
            worst = max(worst, float(np.abs(kos[0][i, k] - ref_ko[k]).max() / scale))
    tol = TOLERANCE[dtype]
    assert worst <= tol, f"one-pass vs per-layer knockout: max relative error {worst:.2e} > {tol:.0e}"
    return (
        clean,
        kos,
    ), f"{n} samples, clean + E_Q + 3 controls; one-pass vs per-layer max rel. err {worst:.1e}"


def stage_probes(arrays, n: int):
    clean, kos = arrays
    labels = np.array([0, 1] * (n // 2))
    ids = [f"s{i}" for i in range(n)]
    auc, samples = run_probes(clean, kos, labels, ids, seeds=[0], test_size=0.2, max_iter=200)
    row = check(samples, min_samples=10, n_boot=200)
    assert auc["status"].to_list()[0] == "ok" and samples.height == 2 * n * clean.shape[1]
    return f"{auc.height} per-layer probes, check verdict on random labels: {row['verdict']}"


@torch.inference_mode()
def stage_mink(lm, n: int):
    vocab = lm.model.config.vocab_size
    seqs, _, _, _ = case(n, vocab, seed=2)
    from truthflow.batching import pad_batch

    ids, valid = pad_batch(seqs, 0, side="right")
    device = next(lm.model.parameters()).device
    logits = lm.model(
        input_ids=ids.to(device), attention_mask=valid.long().to(device), use_cache=False
    ).logits
    stats = batch_token_statistics(logits[:, :-1], ids[:, 1:].to(device), [len(s) - 1 for s in seqs])
    assert len(stats) == n and all(np.isfinite(s[0]).all() and (s[0] <= 0).all() for s in stats)
    return f"{n} texts scored (log p, mu, sigma per token)"


def stage_judge(lm):
    from truthflow.generation import generate_answers

    prompt = [[2] + list(range(10, 60))]  # a long judge prompt, decoded greedily as the hf judge does
    out = generate_answers(lm, [""], 1, 8, stop_at_newline=False, chat=False, prompt_ids=prompt)
    assert out[0]["n_new_tokens"] >= 1
    return "judge prompt decoded"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama-3.2-1b", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(TOLERANCE))
    ap.add_argument("--n", type=int, default=128)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    lm = random_model(args.shape, dtype=args.dtype, device=device)
    print(
        f"{args.shape} ({args.dtype}, {device}): random weights in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    failed = 0
    arrays = None
    stages = [
        ("generation", lambda: stage_generation(lm, args.n)),
        ("extraction + knockout", lambda: stage_extraction(lm, args.n, args.dtype)),
        ("probes + check", lambda: stage_probes(arrays, args.n)),
        ("MIN-K%", lambda: stage_mink(lm, min(args.n, 64))),
        ("HF judge path", lambda: stage_judge(lm)),
    ]
    for name, fn in stages:
        t = time.perf_counter()
        try:
            result = fn()
            if name.startswith("extraction"):
                arrays, result = result
            sync()
            print(f"  PASS {name:<22} {time.perf_counter() - t:6.1f} s  {result}", flush=True)
        except Exception as exc:  # noqa: BLE001 - a smoke check reports every stage
            failed += 1
            print(f"  FAIL {name:<22} {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
    print(
        f"{'all stages passed' if not failed else f'{failed} stage(s) failed'}; "
        f"peak GPU memory {peak:.1f} GiB"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
