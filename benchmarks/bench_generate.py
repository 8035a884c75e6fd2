"""Generation throughput: the project's generate_answers beside a plain `model.generate` reference, each timed
as a job meets it: its first call on prompts the process has not seen, then the repeat on the same prompts.

CPU (demo models, real questions of varied length):  python benchmarks/bench_generate.py
GPU (random weights of a real shape):                python benchmarks/bench_generate.py --shape llama-3.2-1b

Settings: the project runs with the batch cap and token budget the memory plan gives the model on the card
(--gpu-mem-gb; common.plan_settings); the plain reference at the same memory: fixed batches of the most rows
whose longest prompt plus the new tokens fit that budget, the prompts in their given order, left-padded,
dynamic cache, stopping on the same token ids. The two paths run different prompts (random shapes: lengths in
two residue classes, common.fresh_lengths; demo models: disjoint question sets), so neither is warmed by the
other.
After the timings, the plain reference runs the project's first prompts (untimed) to count identical answers.
New tokens count the answer tokens before the first stop token, for both.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO / "src"))
import common  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from truthflow.engine import backend  # noqa: E402
from truthflow.engine.batches import pad_batch  # noqa: E402
from truthflow.engine.decoding import GREEDY  # noqa: E402
from truthflow.generation import (  # noqa: E402
    build_prompt,
    encode_prompt,
    eos_token_ids,
    generate_answers,
    newline_token_ids,
)
from truthflow.memplan import Dims  # noqa: E402
from truthflow.models import load_model  # noqa: E402

QA_SETS = [
    ("popqa", "popqa/popqa.tsv"),
    ("triviaqa", "triviaqa/validation.jsonl"),
    ("hotpotqa", "hotpotqa/hotpot_dev_distractor_v1.json"),
    ("nq", "nq/NQ-open.dev.jsonl"),
]
CHECKED = 64  # prompts the plain reference reruns to count identical answers


@torch.inference_mode()
def plain_generate(lm, encoded, batch, max_new, stop_ids) -> list[list[int]]:
    """The reference: model.generate on fixed batches in the given order, under the project's attention
    setting. Returns each prompt's answer ids (before the first stop token)."""
    model, tok = lm.model, lm.tokenizer
    device = model.get_input_embeddings().weight.device
    pad = tok.pad_token_id
    answers = []
    with backend.attention(lm.attention):
        for start in range(0, len(encoded), batch):
            ids, valid = pad_batch(encoded[start : start + batch], pad, side="left")
            out = model.generate(
                input_ids=ids.to(device),
                attention_mask=valid.long().to(device),
                max_new_tokens=max_new,
                **GREEDY,
                pad_token_id=pad,
                eos_token_id=sorted(stop_ids),
                cache_implementation="dynamic",
            )
            for row in out[:, ids.shape[1] :].tolist():
                cut = next((j for j, t in enumerate(row) if t in stop_ids), len(row))
                answers.append(row[:cut])
    common.sync()
    return answers


def compare(lm, label, dims, cases, chat, stop_at_newline, args) -> None:
    """cases: (prompts, encoded) of the project and of the reference."""
    plan = common.settings(args, dims, str(lm.model.dtype).removeprefix("torch."))
    batch, budget, max_new = plan["batch_size"], plan["token_budget"], args.max_new_tokens
    (prompts, encoded), (_, ref_encoded) = cases
    common.init_device(lm)

    def project():
        return generate_answers(
            lm, prompts, batch, max_new, stop_at_newline, chat, label, budget, prompt_ids=encoded
        )

    t_first, t_rep, ours, again = common.first_and_repeat(project)
    stop_ids = eos_token_ids(lm.tokenizer, lm.model)
    if stop_at_newline:
        stop_ids |= set(newline_token_ids(lm.tokenizer))
    # the same memory as the project's budget: the most rows whose longest prompt and new tokens fit it
    fixed = max(1, min(batch, budget // (max(map(len, ref_encoded)) + max_new)))
    p_first, p_rep, plain, _ = common.first_and_repeat(
        lambda: plain_generate(lm, ref_encoded, fixed, max_new, stop_ids)
    )
    n_ours = sum(o["n_new_tokens"] for o in ours)
    n_plain = sum(len(a) for a in plain)
    m = min(CHECKED, len(encoded))
    check = plain_generate(lm, encoded[:m], fixed, max_new, stop_ids)
    same = sum(o["answer_ids"] == a for o, a in zip(ours, check, strict=False))
    # CPU fp32: every count is exact; a GPU in bf16 on random weights has
    # near-tied logits that batch composition can flip, so count, do not assert
    repeat = sum(a == o for a, o in zip(again, ours, strict=True))
    lens = sorted(len(e) for e in encoded)
    what = f"{len(encoded)} prompts of {lens[0]}-{lens[-1]} tokens (median {lens[len(lens) // 2]}) per path"
    print(
        common.header(label, lm, f"{what}, max {max_new} new; {plan['line']}") + "\n"
        f"{common.rate_line(f'project ({n_ours:,} new tokens)', n_ours, 'tokens', t_first, t_rep)}\n"
        f"{common.rate_line(f'plain ({n_plain:,} new tokens)', n_plain, 'tokens', p_first, p_rep)}\n"
        f"  plain: fixed batch {fixed}, given order; peak memory {common.peak_mb():,.0f} MiB\n"
        f"  ratio project/plain: first calls {n_ours / t_first / (n_plain / p_first):.2f}x, repeats "
        f"{n_ours / t_rep / (n_plain / p_rep):.2f}x; identical answers {same}/{m}; the project's two runs "
        f"agree on {repeat}/{len(encoded)}",
        flush=True,
    )


def demo_questions(n: int) -> list[str]:
    from truthflow.data import load_qa

    per_set = -(-n // len(QA_SETS))
    out = []
    for name, path in QA_SETS:
        spec = {"source": {"local": str(REPO / "data" / "demo" / path)}, "n": per_set, "seed": 1}
        out += load_qa(name, spec)[0]["question"].to_list()
    return out[:n]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", help="random-weight model shape (benchmarks/shapes.py), e.g. llama-3.2-1b")
    ap.add_argument("--models", nargs="*", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--dtype", default="bfloat16", help="--shape: the weights' dtype")
    ap.add_argument("--n", type=int, default=None, help="prompts per path (demo: 48; --shape: 512)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="demo: 24; --shape: 64")
    ap.add_argument("--min-len", type=int, default=16, help="--shape: shortest random prompt")
    ap.add_argument("--max-len", type=int, default=256, help="--shape: longest random prompt")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads (default: all)")
    common.add_settings_args(ap, "batch cap of the project")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.shape:
        from shapes import dims, random_model

        args.n = args.n or 512
        args.max_new_tokens = args.max_new_tokens or 64
        lm = random_model(args.shape, args.dtype, attention=args.attention)
        rng = np.random.default_rng(0)
        # random weights never emit EOS on purpose: every row generates max_new_tokens
        cases = []
        for case in (0, 1):  # the project's prompts, the reference's: lengths in two residue classes
            lens = common.fresh_lengths(rng, args.n, args.min_len, args.max_len, case)
            encoded = [[2, *rng.integers(3, 1000, size=k - 1).tolist()] for k in lens]
            cases.append(([""] * args.n, encoded))
        compare(
            lm, f"{args.shape} (random weights, {args.dtype})", dims(args.shape), cases, False, False, args
        )
        return
    args.n = args.n or 48
    args.max_new_tokens = args.max_new_tokens or 24
    questions = demo_questions(2 * args.n)
    config = yaml.safe_load((REPO / "config.yaml").read_text())["models"]
    for name in args.models:
        path = REPO / "resources" / "models" / name
        lm = load_model(path, "float32", attention=args.attention)
        chat = bool(config[name].get("chat", False))
        cases = []
        for part in (questions[: args.n], questions[args.n :]):  # the project's questions, the reference's
            prompts = [build_prompt(lm.tokenizer, q, chat) for q in part]
            cases.append((prompts, [encode_prompt(lm.tokenizer, p, chat) for p in prompts]))
        compare(lm, name, Dims.of(lm.model.config.to_dict()), cases, chat, not chat, args)


if __name__ == "__main__":
    main()
