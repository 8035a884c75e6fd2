"""Times score_mink (questions/s) with peak memory, on its first call (on shapes the process has not seen) and
again on the same inputs, and answer_depthqa (new tokens/s) on each answers backend side by side.

CPU, demo models on the demo DepthQA questions: python benchmarks/bench_depth.py
GPU, random-weight Llama-3-8B shape:            python benchmarks/bench_depth.py --shape llama-3-8b --n 512

The demo models (config.yaml's depth.models, prepared in --models-dir as the workflow prepares them): MIN-K%
in this process at the memory plan's batch size (--gpu-mem-gb), then answer_depthqa as the workflow runs it,
once per backend (--backends: the engine and vLLM), each in a fresh process, the backends alternating which
goes first model by model (bench_answers.py): the config's batch size, token budget, depth.max_new_tokens,
depth.decoding and prompt layout, the job's load or engine start and first answers included, then the answers
again in the same process; and how many greedy answers the backends give alike.

--shape: random weights, in this process: MIN-K% and the engine's answers (--max-new-tokens), first call and
repeat, at the memory plan's batch size and token budget (random shapes give the two stages lengths in
different residue classes). vLLM needs the weights on disk: the shape path times the engine alone.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_answers  # noqa: E402
import common  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
import torch  # noqa: E402

import truthflow.depth.mink as mink  # noqa: E402
import truthflow.generation as generation  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def bench(lm, label, dims, texts, prompts, args):
    """MIN-K% of texts, and with prompts (the shape path) the engine's answers to them, in this process."""
    plan = common.settings(args, dims, str(lm.model.dtype).removeprefix("torch."))
    batch, budget, max_new = plan["batch_size"], plan["token_budget"], args.max_new_tokens
    print(common.header(label, lm, plan["line"]), flush=True)
    t_first, t_rep, _, _ = common.first_and_repeat(
        lambda: mink.score_texts(lm, texts, [10, 20, 30], batch, "min-k%")
    )
    print(
        common.rate_line(f"score_mink {len(texts)} questions", len(texts), "questions", t_first, t_rep),
        flush=True,
    )
    if prompts is not None:
        t_first, t_rep, out, _ = common.first_and_repeat(
            lambda: generation.generate_answers(lm, prompts, batch, max_new, True, False, "answer", budget)
        )
        n_tok = sum(o["n_new_tokens"] for o in out)
        name = f"answer_depthqa {len(prompts)} answers, {n_tok} new tokens"
        print(common.rate_line(name, n_tok, "new tokens", t_first, t_rep), flush=True)
    print(f"  peak memory {common.peak_mb():,.0f} MiB", flush=True)


def demo(args) -> None:
    """The demo models: MIN-K% here, then answer_depthqa as a job on each backend (module docstring)."""
    from truthflow.memplan import Dims
    from truthflow.models import load_model

    models_dir = Path(args.models_dir).resolve()
    os.chdir(REPO)  # the config's local sources are relative to the checkout, as for Snakemake
    config = bench_answers.demo_config(REPO / "config.yaml")
    jobs = bench_answers.answer_jobs(config, ["answer_depthqa"], args.models)
    with tempfile.TemporaryDirectory(prefix="bench_depth.") as tmp:
        paths = bench_answers.prepare_inputs(config, jobs, Path(tmp), models_dir)
        questions = pl.read_parquet(paths["depthqa"])["question"].to_list()
        for _, model, _ in jobs:
            dtype = config["models"][model]["dtype"]
            lm = load_model(paths[model], dtype, attention=args.attention)
            label = f"{model} ({dtype})"
            bench(lm, label, Dims.of(lm.model.config.to_dict()), questions[: args.n], None, args)
            del lm
        threads = bench_answers.job_threads(args.cores)
        print(
            f"answer_depthqa of config.yaml as the workflow runs it, one fresh process per backend, on "
            f"{bench_answers.machine(threads)}",
            flush=True,
        )
        bench_answers.compare(config, jobs, args.backends, paths, Path(tmp), args.cores, repeat=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape")
    ap.add_argument("--models", nargs="*", help="demo models (default: config.yaml's depth.models)")
    ap.add_argument("--dtype", default="bfloat16", help="--shape: the weights' dtype")
    ap.add_argument("--n", type=int, default=64, help="questions MIN-K% scores (the jobs answer all)")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="--shape (the jobs: depth.max_new_tokens)")
    ap.add_argument("--backends", nargs="+", choices=bench_answers.BACKENDS, default=bench_answers.BACKENDS)
    ap.add_argument("--models-dir", default=str(REPO / "resources" / "models"), help="prepared demo models")
    ap.add_argument("--cores", type=int, default=8, help="the demo run's --cores: sets the jobs' threads")
    common.add_settings_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    if not args.shape:
        return demo(args)
    rng = np.random.default_rng(0)
    # DepthQA questions: 20-60 tokens; the scored texts and the prompts in two residue classes
    texts, prompts = (
        [
            [2, *rng.integers(3, 1000, size=k - 1).tolist()]
            for k in common.fresh_lengths(rng, args.n, 20, 60, c)
        ]
        for c in (0, 1)
    )
    mink.encode_for_scoring = lambda tok, text: text
    generation.encode_prompt = lambda tok, p, c: p
    for lm, label, dims in common.bench_models(args.shape, [], args.attention, args.dtype):
        bench(lm, label, dims, texts, prompts, args)


# vLLM may spawn its engine process, which imports this file again: only the bench itself runs main
if __name__ == "__main__":
    main()
