"""Job mode: one whole extraction job of a (model, dataset), timed stage by stage as the workflow runs it.

    python benchmarks/bench_job.py --shape llama-3.2-1b --n 2000            # on a GPU
    python benchmarks/bench_job.py --shape tiny --dtype float32 --n 16      # anywhere (seconds)
    python benchmarks/bench_job.py --shape qwen3-8b --n 2000 --record       # append to throughput.tsv

Stages, each through the package's own functions with the workflow's settings: the answers
(`generation.generate_answers`, base-model prompts, the model's max_new_tokens);
`pathways.extract.knockout_states`, which runs saliency and the knockout (the clean condition, E_Q and the
workflow's control draws, in one engine run);
`pathways.extract.experiment_states` at layer K = L/2: patching, answer-only, Pathway Reweighting (the default
pr_factors) and P(True); and MIN-K% scoring of the questions (`depth.mink.score_texts`, the depth job's pass).
Each stage's time is read by wrapping the function the job module calls (`timed_stages`), so the job's code
runs unchanged. Batch size and token budget are the memory plan's for the shape on the card (--gpu-mem-gb);
saliency takes the schema's saliency_batch_size. Every shape is new to the process: this is what a job pays.

Random weights never stop answering: every answer runs to --max-new-tokens (the workflow's cap, so the answers
stage is an upper bound), and the teacher-forced stages read the first --answer-tokens of it (a short answer).
Questions are 6-20 random words (the stand-in tokenizer gives a word one id, as a BPE tokenizer nearly does).
Not timed: exact-token location and the probes (CPU, seconds).
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
import torch  # noqa: E402
from common import REPO, add_settings_args, attention_line, card, peak_mb, settings, sync  # noqa: E402

import truthflow.pathways.extract as extract  # noqa: E402
from truthflow.config import schema_defaults  # noqa: E402
from truthflow.depth.mink import score_texts  # noqa: E402
from truthflow.generation import build_prompt, generate_answers  # noqa: E402
from truthflow.pathways.activations import experiment_shapes  # noqa: E402

STAGES = ("answers", "saliency", "knockout", "patching", "answer-only", "reweighting", "P(True)", "MIN-K%")
TABLE = Path(__file__).resolve().parent / "throughput.tsv"
COLUMNS = ("shape", "card", "stage", "samples_per_s", "n", "dtype", "max_new_tokens", "settings", "source")
# extract's engine runs (its residual-stream passes) by the start of their desc; any other is the knockout's
RESID_STAGES = (("patching", "patching"), ("answer only", "answer-only"), ("PR", "reweighting"))


class StageTimer:
    def __init__(self):
        self.seconds = dict.fromkeys(STAGES, 0.0)

    @contextmanager
    def stage(self, name: str):
        sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            sync()
            self.seconds[name] += time.perf_counter() - t0

    def wrap(self, fn, name_of):
        signature = inspect.signature(fn)

        def timed(*args, **kwargs):
            with self.stage(name_of(signature.bind(*args, **kwargs).arguments)):
                return fn(*args, **kwargs)

        return timed


@contextmanager
def timed_stages(timer: StageTimer):
    """Within the block, the functions the job modules call record their time in `timer`."""

    def resid_stage(arguments) -> str:
        desc = arguments.get("desc", "")
        return next((stage for start, stage in RESID_STAGES if desc.startswith(start)), "knockout")

    patches = [
        (extract, "saliency", timer.wrap(extract.saliency, lambda _: "saliency")),
        (extract, "run", timer.wrap(extract.run, resid_stage)),
        (extract, "p_true", timer.wrap(extract.p_true, lambda _: "P(True)")),
    ]
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    try:
        for module, name, fn in patches:
            setattr(module, name, fn)
        yield
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)


def questions(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [
        " ".join(f"w{k}" for k in rng.integers(0, 5000, size=m)) + "?" for m in rng.integers(6, 21, size=n)
    ]


def kept_table(qs: list[str], answers: list[dict], answer_tokens: int, seed: int) -> pl.DataFrame:
    """knockout_states' input: each answer cut to answer_tokens (padded with random ids where it stopped
    early); E_Q 2-3 question words, E_A the answer's last 1-3 tokens, the probe on the last; half of them
    correct."""
    rng = np.random.default_rng(seed)
    rows = []
    for i, (q, a) in enumerate(zip(qs, answers, strict=True)):
        prompt = a["prompt_ids"]  # [BOS, "Q:", the question's words..., "A:"]
        answer = (a["answer_ids"] + rng.integers(3, 1000, size=answer_tokens).tolist())[:answer_tokens]
        question = list(range(2, len(prompt) - 1))
        eq = sorted(rng.choice(question, size=int(rng.integers(2, 4)), replace=False).tolist())
        start = len(prompt)
        ea = list(range(start + answer_tokens - int(rng.integers(1, 4)), start + answer_tokens))
        rows.append(
            {
                "id": f"s{i}",
                "correct": bool(i % 2),
                "refusal": False,
                "seq": prompt + answer,
                "answer_start": start,
                "eq_positions": eq,
                "ea_positions": ea,
                "probe_position": ea[-1],
                "question_positions": question,
                "eq_text": "",
                "ea_text": "",
                "question": q,
                "prompt_ids": prompt,
                "answer_ids": answer,
                "answer": a["answer"],
            }
        )
    return pl.DataFrame(rows)


def run_job(lm, n: int, plan: dict, max_new: int, answer_tokens: int, seed: int = 0) -> dict[str, float]:
    """The job's stages on n fresh questions; seconds per stage."""
    knockout = schema_defaults("pathways", "knockout")
    experiments = schema_defaults("pathways", "experiments")
    k_grid = schema_defaults("depth", "mink")["k_grid"]
    batch, budget = plan["batch_size"], plan["token_budget"]
    timer = StageTimer()
    qs = questions(n, seed)
    prompts = [build_prompt(lm.tokenizer, q, chat=False) for q in qs]
    with timer.stage("answers"):
        answers = generate_answers(lm, prompts, batch, max_new, True, False, "answers", budget)
    table = kept_table(qs, answers, answer_tokens, seed)
    name = "benchmark job"
    with timed_stages(timer):
        kept = table.select(list(extract.LOCATED_SCHEMA))
        samples, scores = extract.knockout_states(
            lm, kept, batch, knockout, experiments["saliency_batch_size"], f"knockout {name}"
        )
        full = samples.join(
            table.select("id", "prompt_ids", "answer_ids", "answer", "question"), on="id"
        ).join(scores, on="id")
        hidden, layer = lm.info["hidden_size"], max(1, lm.info["n_layers"] // 2)
        shapes = experiment_shapes(n, hidden, len(experiments["pr_factors"])).values()
        outs = [np.zeros(shape, np.float32) for shape in shapes]  # in memory: the values exactly
        extract.experiment_states(lm, full, layer, experiments, batch, False, None, outs, name)
    with timer.stage("MIN-K%"):
        score_texts(lm, qs, k_grid, batch)
    return timer.seconds


def measure(
    shape: str,
    n: int,
    dtype: str,
    gpu_mem_gb: float | None,
    max_new: int,
    answer_tokens: int,
    attention: str = "auto",
    batch: int | None = None,
    token_budget: int | None = None,
) -> dict:
    """One job on random weights of `shape`: {"seconds": per stage, "plan": the settings, "lm": the model}."""
    from shapes import dims, random_model

    lm = random_model(shape, dtype=dtype, attention=attention)
    args = argparse.Namespace(gpu_mem_gb=gpu_mem_gb, batch=batch, token_budget=token_budget)
    plan = settings(args, dims(shape), dtype)
    return {"seconds": run_job(lm, n, plan, max_new, answer_tokens), "plan": plan, "lm": lm}


def model_default(key: str):
    """The schema's default of a model entry's key."""
    import yaml

    from truthflow.config import SCHEMA

    return yaml.safe_load(SCHEMA.read_text())["$defs"]["model"]["properties"][key]["default"]


def card_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def record(path: Path, shape: str, seconds: dict, n: int, dtype: str, max_new: int, plan: dict) -> None:
    """Append one row per stage to the throughput table (paper_cost.py reads it)."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()
    source = f"bench_job.py {datetime.date.today()} at {commit or 'unknown'}"
    line = f"batch {plan['batch_size']}, token budget {plan['token_budget']}"
    rows = [
        (shape, card_name(), stage, f"{n / t:.2f}", n, dtype, max_new, line, source)
        for stage, t in seconds.items()
    ]
    new = not path.exists()
    with path.open("a") as f:
        if new:
            f.write("\t".join(COLUMNS) + "\n")
        for row in rows:
            f.write("\t".join(map(str, row)) + "\n")


def report(seconds: dict, n: int, repeat: dict | None = None) -> None:
    extra = "   repeat: s, samples/s, first/repeat" if repeat else ""
    print(f"  {'stage':<12} {'seconds':>9} {'samples/s':>11}{extra}")
    for stage, t in [*seconds.items(), ("total", sum(seconds.values()))]:
        line = f"  {stage:<12} {t:9.2f} {n / t:11,.1f}"
        if repeat:
            r = repeat[stage] if stage in repeat else sum(repeat.values())
            line += f"   {r:9.2f} {n / r:11,.1f} {r / t:6.0%}"
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama-3.2-1b")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--n", type=int, default=2000, help="questions of the job")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the schema's (64)")
    ap.add_argument("--answer-tokens", type=int, default=8, help="answer tokens the later stages read")
    ap.add_argument("--repeat", action="store_true", help="run the job again on the same inputs, beside it")
    ap.add_argument(
        "--record", nargs="?", const=str(TABLE), help=f"append the figures (default {TABLE.name})"
    )
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    add_settings_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    max_new = args.max_new_tokens or model_default("max_new_tokens")
    t0 = time.perf_counter()
    got = measure(
        args.shape,
        args.n,
        args.dtype,
        args.gpu_mem_gb,
        max_new,
        args.answer_tokens,
        args.attention,
        args.batch,
        args.token_budget,
    )
    seconds, plan, lm = got["seconds"], got["plan"], got["lm"]
    again = run_job(lm, args.n, plan, max_new, args.answer_tokens) if args.repeat else None
    print(
        f"job mode: {args.shape} ({args.dtype}) on {card()}, {args.n} questions, max {max_new} new tokens, "
        f"{args.answer_tokens} answer tokens read; {plan['line']}\n  {attention_line(lm)}"
    )
    report(seconds, args.n, again)
    print(f"  peak memory {peak_mb():,.0f} MiB; wall {time.perf_counter() - t0:.1f} s", flush=True)
    if args.record:
        record(Path(args.record), args.shape, seconds, args.n, args.dtype, max_new, plan)
        print(f"  recorded {len(seconds)} rows in {args.record}")


if __name__ == "__main__":
    main()
