"""GPU smoke check: every model stage once, in bf16, on random weights of a real shape, plus exactness.

    python benchmarks/gpu_smoke.py --shape llama-3.2-1b        # on a GPU (about a minute)
    python benchmarks/gpu_smoke.py --shape tiny --dtype float32 # anywhere, CPU included (seconds)

Stages: generation (generate_answers, dynamic cache, var-len prompts); chat generation through a Qwen3-style
template with thinking on (prompts sharing the template's head: the shared-prefix prefill, and the
reasoning-block strip); extraction with knockout (the one-pass sweep from a shared head, E_Q and three matched
control draws, compared with the naive per-layer reference within a tolerance for the dtype); probes
(cross-fitted, per-layer) and the falsification check (check + family); the interventions of the experiments
(patching and Pathway Reweighting at layer K from the shared head, Logits-mean/min, P(True)); saliency (eager
attention, the backward through every layer's attention); MIN-K% statistics (the batched scoring path); the HF
judge (truthflow.depth.judge.HFJudge on the same weights: rubric prompts through the chat template, thinking
turned off); and, where two GPUs are visible, the same weights saved and loaded by `models.load_pretrained`
over both (device_map) for generation, the knockout sweep and the logit baselines. The text stages use the
twins' byte-level stand-in tokenizer (truthflow.twins, a few hundred ids, valid in any shape's vocabulary).
Exit status 1 when any stage fails.
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
import polars as pl  # noqa: E402
import torch  # noqa: E402
from common import answer_logprobs, sync  # noqa: E402
from shapes import SHAPES, random_model  # noqa: E402

from truthflow.config import schema_defaults  # noqa: E402
from truthflow.depth.mink import CHUNK_ELEMENTS, token_moments  # noqa: E402
from truthflow.engine import Condition, Logits, Resid, describe_attention, run  # noqa: E402
from truthflow.engine.hooks import LayerMasks, ResidCapture  # noqa: E402
from truthflow.engine.masks import attention_mask, layer_windows, model_mask, positions_tensor  # noqa: E402
from truthflow.engine.passes import batch_tensors, model_parts  # noqa: E402
from truthflow.models import LoadedModel  # noqa: E402
from truthflow.pathways import interventions  # noqa: E402
from truthflow.pathways.check import check, family  # noqa: E402
from truthflow.pathways.probes import run_probes  # noqa: E402
from truthflow.pathways.saliency import saliency  # noqa: E402
from truthflow.twins import build_tokenizer  # noqa: E402

HEAD = 16  # tokens every sequence shares (a chat template's header): the shared-prefix paths run
QUESTIONS = [
    "What is the capital of France?",
    "Who wrote Hamlet?",
    "How many legs does a spider have?",
    "Who painted the Mona Lisa?",
]

# relative tolerance of one-pass vs per-layer knockout: float32 is exact to rounding; bf16 has 8 mantissa bits
TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}


def case(n: int, vocab: int, seed: int = 0):
    """n sequences of 32-64 tokens sharing a HEAD-token head; the question is the first half after it."""
    rng = np.random.default_rng(seed)
    head = rng.integers(3, vocab, size=HEAD).tolist()
    seqs = [head + rng.integers(3, vocab, size=int(m) - HEAD).tolist() for m in rng.integers(32, 64, size=n)]
    probe = [len(s) - 1 for s in seqs]
    question = [list(range(HEAD, HEAD + (len(s) - HEAD) // 2)) for s in seqs]
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


@torch.inference_mode()
def per_layer_reference(
    lm, seq: list[int], probe: int, block: list[int] | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """The naive loop the one-pass trick replaces: for each layer k a full pass with the block applied only
    in layers 1..k via per-layer pre-hooks. Returns (resid_clean, resid_ko) [L, D] float32; block None: the
    clean pass alone, (resid_clean, None)."""
    base, device, dtype = model_parts(lm.model)
    layers = base.layers
    ids, valid = batch_tensors([seq[: probe + 1]], 0, device)
    clean_mask = attention_mask(valid, None, dtype)
    cap = ResidCapture(layers)
    cap.set_positions([probe])
    per_layer = LayerMasks(layers, layer_windows(base.config))
    clean_in = model_mask(base.config, clean_mask)
    try:
        base(input_ids=ids, attention_mask=clean_in, use_cache=False)
        clean, kos = cap.stacked()[0].numpy(), []
        if block is None:
            return clean, None
        ko_mask = attention_mask(valid, positions_tensor([block], [ids.shape[1]], ids.shape, device), dtype)
        for k in range(len(layers)):
            per_layer.masks = {j: (ko_mask if j <= k else clean_mask) for j in range(len(layers))}
            base(input_ids=ids, attention_mask=clean_in, use_cache=False)
            kos.append(cap.resid_post[k][0].float().cpu())
        return clean, torch.stack(kos).numpy()
    finally:
        cap.remove()
        per_layer.remove()


def sweep(lm, seqs, probe, blocks, batch_size: int) -> list[np.ndarray]:
    """The clean states and one knockout per block list, [N, L, D] float32 each (the engine's `Resid`)."""
    conds = [Condition(), *(Condition(block=b) for b in blocks)]
    shape = (len(seqs), lm.model.config.num_hidden_layers, lm.model.config.hidden_size)
    out = [np.zeros(shape, np.float32) for _ in conds]
    states = run(lm, seqs, Resid(probe, out=out), batch_size, conds)
    sync()
    return states


def rel_err(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(a - ref).max() / max(np.abs(ref).max(), 1e-6))


def stage_extraction(lm, n: int, dtype: str):
    vocab = lm.model.config.vocab_size
    seqs, probe, eq, controls = case(n, vocab)
    clean, *kos = sweep(lm, seqs, probe, [eq, *controls], 64)
    worst = noise = 0.0
    for i in range(3):  # exactness: one-pass cumulative knockout vs the per-layer reference passes
        ref_clean, ref_ko = per_layer_reference(lm, seqs[i], probe[i], eq[i])
        for k in range(ref_ko.shape[0]):
            worst = max(worst, rel_err(kos[0][i, k], ref_ko[k]))
            noise = max(noise, rel_err(clean[i, k], ref_clean[k]))
    # the bound: the dtype's tolerance, or twice the rounding noise of the same two paths' CLEAN states
    # (batched with a shared head vs one row in full: in bf16 it grows with depth, 5e-2 at 36 layers); a
    # knockout that blocked nothing or the wrong tokens is off by O(1), far above either
    tol = max(TOLERANCE[dtype], 2 * noise)
    assert worst <= tol, f"one-pass vs per-layer knockout: max relative error {worst:.2e} > {tol:.1e}"
    return (
        (
            clean,
            kos,
        ),
        f"{n} samples, clean + E_Q + 3 controls; one-pass vs per-layer max rel. err {worst:.1e} "
        f"(clean {noise:.1e})",
    )


def stage_probes(arrays, n: int):
    clean, kos = arrays
    labels = np.array([0, 1] * (n // 2))
    ids = [f"s{i}" for i in range(n)]
    auc, samples = run_probes(
        clean, kos, labels, ids, {"seeds": [0], "test_size": 0.2, "C": 1.0, "max_iter": 200}
    )
    cells = check(samples, auc).select(
        pl.lit("smoke").alias("model"), pl.lit("random").alias("dataset"), pl.all()
    )
    table, _ = family(cells, schema_defaults("pathways", "check", given={"min_samples": 10}))
    assert auc["status"].to_list()[0] == "ok" and samples.height == 2 * n * clean.shape[1]
    return f"{auc.height} per-layer probes, check verdict on random labels: {table['verdict'][0]}"


def stage_chat_generation(chat_lm, n: int):
    """Chat prompts with thinking on (the template opens <think>): the shared head is prefilled once."""
    from truthflow.engine.batches import MIN_SHARED_PREFIX, common_head
    from truthflow.generation import build_prompt, encode_prompt, generate_answers

    prompts = [build_prompt(chat_lm.tokenizer, QUESTIONS[i % 4], True) for i in range(n)]
    assert all(p.endswith("<think>\n") for p in prompts)
    head = common_head([encode_prompt(chat_lm.tokenizer, p, True) for p in prompts], 10**6)
    assert head >= MIN_SHARED_PREFIX
    out = generate_answers(
        chat_lm, prompts, batch_size=n, max_new_tokens=16, stop_at_newline=False, chat=True
    )
    tokens = sum(o["n_new_tokens"] for o in out)
    assert len(out) == n
    stripped = sum(o["think_stripped"] for o in out)
    return f"{n} chat prompts (shared head {head} tokens), {tokens} new tokens, {stripped} blocks stripped"


def stage_interventions(chat_lm, n: int):
    """Patching and Pathway Reweighting at layer K (shared head); Logits-mean/min; P(True)."""
    seqs, probe, eq, _ = case(n, chat_lm.model.config.vocab_size, seed=3)
    k = max(1, chat_lm.model.config.num_hidden_layers // 2)
    patched = [interventions.patch(s, e, [5] * len(e)) for s, e in zip(seqs, eq, strict=True)]
    answer = [list(range(p - 3, p + 1)) for p in probe]
    conds = [Condition(tokens=patched), Condition(edges=(answer, eq), factor=2.0)]
    states = run(chat_lm, seqs, Resid(probe, layer=k), 16, conds)
    mean, low = answer_logprobs(chat_lm, seqs, answer, batch_size=16)
    pt = interventions.p_true(chat_lm, seqs, batch_size=16)
    sync()
    assert all(np.isfinite(x).all() for x in (*states, mean, low, pt)) and ((pt >= 0) & (pt <= 1)).all()
    return f"{n} samples: patching + reweighting at layer {k}, logit baselines, P(True)"


def stage_saliency(lm, n: int):
    seqs, probe, eq, _ = case(min(n, 8), lm.model.config.vocab_size, seed=4)
    starts = [p - 3 for p in probe]
    ea = [[p - 1, p] for p in probe]
    s = saliency(lm, seqs, starts, eq, ea, batch_size=4).scores
    sync()
    assert s.shape == (len(seqs), lm.model.config.num_hidden_layers, 2) and np.isfinite(s).all()
    return f"{len(seqs)} samples x {s.shape[1]} layers, eager attention backward"


def stage_mink(lm, n: int):
    seqs, _, _, _ = case(n, lm.model.config.vocab_size, seed=2)
    # the scoring pass of depth.mink.score_texts: float32 logits a chunk at a time, one batch of n texts
    scored = Logits([range(len(s) - 1) for s in seqs], token_moments, chunk_elements=CHUNK_ELEMENTS)
    stats = run(lm, seqs, scored, n)
    assert len(stats) == n and all(np.isfinite(s[0]).all() and (s[0] <= 0).all() for s in stats)
    return f"{n} texts scored (log p, mu, sigma per token)"


def stage_judge(chat_lm):
    """HFJudge itself on these weights: rubric prompts through the chat template, thinking turned off."""
    from truthflow.config import schema_defaults
    from truthflow.depth.judge import HFJudge

    class SmokeJudge(HFJudge):
        def _load(self):
            return chat_lm

    given = {"backend": "hf", "model": "random weights", "max_new_tokens": 8, "batch_size": 2}
    judge = SmokeJudge(schema_defaults("depth", "judge", given=given))
    rows = [{"question": q, "answer": "Paris", "reference": "Paris"} for q in QUESTIONS]
    assert judge._prompt(rows[0]).endswith("<think>\n\n</think>\n\n")
    verdicts = list(judge.verdicts(rows))
    assert len(verdicts) == len(rows)
    return f"{len(rows)} rubric prompts judged ({sum(v.score is not None for _, v in verdicts)} parsed)"


def stage_split(lm, chat_lm, n: int, dtype: str):
    """The same weights saved, loaded by load_pretrained over two GPUs (device_map), and run."""
    import tempfile

    from truthflow.generation import generate_answers
    from truthflow.models import load_pretrained

    with tempfile.TemporaryDirectory() as tmp:
        lm.model.save_pretrained(tmp)
        chat_lm.tokenizer.save_pretrained(tmp)
        model, tok, device = load_pretrained(tmp, dtype, gpus=2)
    split = LoadedModel(model=model, tokenizer=tok, info=lm.info, device=device)
    devices = set(getattr(model, "hf_device_map", {"": device}).values())
    assert len(devices) == 2, f"weights on {devices}, not split over two GPUs"
    seqs, probe, eq, controls = case(n, model.config.vocab_size, seed=5)
    sweep(split, seqs, probe, [eq, *controls], 64)
    answer_logprobs(split, seqs, [[p] for p in probe], batch_size=64)
    out = generate_answers(split, [""] * n, n, 8, stop_at_newline=False, chat=False, prompt_ids=seqs)
    sync()
    return f"over GPUs {sorted(map(str, devices))}: knockout, logit baselines, {len(out)} generations"


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
        f"{args.shape} ({args.dtype}, {device}): random weights in {time.perf_counter() - t0:.1f} s\n"
        f"  {describe_attention(lm.model, lm.attention)}",
        flush=True,
    )
    chat_lm = LoadedModel(model=lm.model, tokenizer=build_tokenizer("qwen3"), info=lm.info, device=device)
    failed = 0
    arrays = None
    stages = [
        ("generation", lambda: stage_generation(lm, args.n)),
        ("chat + thinking", lambda: stage_chat_generation(chat_lm, min(args.n, 16))),
        ("extraction + knockout", lambda: stage_extraction(lm, args.n, args.dtype)),
        ("probes + check", lambda: stage_probes(arrays, args.n)),
        ("interventions", lambda: stage_interventions(chat_lm, args.n)),
        ("saliency", lambda: stage_saliency(lm, args.n)),
        ("MIN-K%", lambda: stage_mink(lm, min(args.n, 64))),
        ("HF judge", lambda: stage_judge(chat_lm)),
    ]
    if torch.cuda.device_count() >= 2:
        stages.append(("two-GPU split", lambda: stage_split(lm, chat_lm, min(args.n, 32), args.dtype)))
    for name, fn in stages:
        t = time.perf_counter()
        if name.startswith("probes") and arrays is None:
            failed += 1
            print(f"  SKIP {name:<22} needs the extraction stage's states", flush=True)
            continue
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
