"""Helpers shared by the benchmark scripts: the models they run, the workflow's batch settings for them, fresh
shapes, and timing a call the first time and again.

The protocol (benchmarks/README.md): a job meets every batch shape for the first time, so each path is timed
on shapes the process has not seen, its first call included, with the repeat call on the same inputs beside
it. The plain reference gets its own fresh shapes (`fresh_lengths`: each timed case draws its lengths from its
own residue class), so neither side is warmed by the other.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

# each timed case of a script draws its lengths from its own class modulo CASES: no two cases share a padded
# width (a batch's width is its longest row), so no case runs a shape another has compiled or planned
CASES = 4


def peak_mb() -> float:
    """Peak GPU memory allocated (CUDA) or peak resident memory of this process (CPU), in MiB."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def init_device(lm) -> None:
    """One forward pass of one token: the device libraries (BLAS, CUDA context) start before the first timed
    call, so the path timed first does not pay a start-up the path timed after it skips. A 1-token pass
    plans no shape a benchmark times."""
    with torch.inference_mode():
        lm.model(torch.tensor([[2]], device=lm.model.get_input_embeddings().weight.device))


def card() -> str:
    """The device the figures come from: the GPU's name, or the CPU with its threads and load."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"cpu ({torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f})"


def visible_gpu_mem_gb() -> float:
    """Memory of the visible GPU in GiB, or 80 (the schema's gpu_mem_gb) without one."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / 2**30
    return 80.0


def add_settings_args(ap, batch_help: str = "rows per batch") -> None:
    """--gpu-mem-gb, --batch and --token-budget: the memory plan's settings unless given."""
    ap.add_argument(
        "--gpu-mem-gb",
        type=float,
        default=None,
        help="memory the plan fills (GiB; default: the visible GPU's, else 80)",
    )
    ap.add_argument("--batch", type=int, default=None, help=f"{batch_help} (default: the memory plan's)")
    ap.add_argument("--token-budget", type=int, default=None, help="generation (default: the memory plan's)")
    ap.add_argument("--attention", default="auto", help="engine.backend setting: auto, cudnn, flash, ...")


def plan_settings(dims, dtype: str, gpu_mem_gb: float | None) -> dict:
    """The batch_size and token_budget the workflow's memory plan (truthflow.memplan) gives a model of these
    dimensions on one GPU of gpu_mem_gb GiB, as a model entry that leaves both out gets them."""
    from truthflow.config import schema_defaults
    from truthflow.memplan import plan_model

    mem = gpu_mem_gb or visible_gpu_mem_gb()
    saliency_batch = schema_defaults("pathways", "experiments")["saliency_batch_size"]
    spec = {"gpu_mem_gb": mem, "gpus": 1, "dtype": dtype}
    plan = plan_model("benchmark", spec, dims, {"generation", "passes", "saliency"}, saliency_batch)
    return {"batch_size": plan["batch_size"], "token_budget": plan["token_budget"], "gpu_mem_gb": mem}


def settings(args, dims, dtype: str) -> dict:
    """The plan's batch_size and token_budget with the command line's overrides (--batch, --token-budget),
    and a line that says where they come from."""
    plan = plan_settings(dims, dtype, args.gpu_mem_gb)
    batch, budget = args.batch or plan["batch_size"], args.token_budget or plan["token_budget"]
    given = "" if (batch, budget) == (plan["batch_size"], plan["token_budget"]) else ", overridden"
    line = f"batch {batch}, token budget {budget:,} (memory plan for {plan['gpu_mem_gb']:.0f} GiB{given})"
    return {**plan, "batch_size": batch, "token_budget": budget, "line": line}


def bench_models(shape: str | None, names: list[str], attention: str = "auto", dtype: str = "bfloat16"):
    """(LoadedModel, label, Dims) of each model a benchmark runs: random weights of `shape` (shapes.py), or
    else the demo's prepared models (resources/models/<name>, float32)."""
    from truthflow.memplan import Dims

    if shape:
        from shapes import dims, random_model

        lm = random_model(shape, dtype=dtype, attention=attention)
        yield lm, f"{shape} (random weights, {dtype})", dims(shape)
        return
    from truthflow.models import load_model

    for name in names:
        path = REPO / "resources" / "models" / name
        lm = load_model(path, "float32", attention=attention)
        yield lm, f"{name} (fp32)", Dims.of(lm.model.config.to_dict())


def attention_line(lm) -> str:
    from truthflow.engine import describe_attention

    return describe_attention(lm.model, lm.attention)


def answer_logprobs(lm, seqs: list[list[int]], ea_positions: list[list[int]], batch_size: int):
    """The plain reference of Logits-mean / Logits-min (METHOD A17): the E_A tokens (token p scored from
    position p-1) from a clean sdpa pass of their own, each sequence cut after its last E_A token, where the
    workflow reads them off the saliency pass. The benchmarks time it; the tests compare with it."""
    from truthflow.engine import Logits, run
    from truthflow.pathways.interventions import logit_baselines, target_logprobs

    ends = [max(e) + 1 if e else 0 for e in ea_positions]
    rows = [s[: max(1, end)] for s, end in zip(seqs, ends, strict=True)]
    at = [[p - 1 for p in e if p >= 1] for e in ea_positions]
    return logit_baselines(run(lm, rows, Logits(at, target_logprobs), batch_size, desc="logits"))


def header(label: str, lm, what: str) -> str:
    """The first lines of a benchmark's figures: the model, the card, what is timed, the attention kernels."""
    return f"{label} on {card()}: {what}\n  {attention_line(lm)}"


def fresh_lengths(rng, n: int, low: int, high: int, case: int) -> list[int]:
    """n lengths in [low, high], all in residue class `case` modulo CASES (module docstring)."""
    if not 0 <= case < CASES:
        raise ValueError(f"case {case} is not in 0..{CASES - 1}")
    raw = rng.integers(low, high + 1, size=n)
    out = [int(x - (x - case) % CASES) for x in raw]
    return [x if x >= low else x + CASES for x in out]


def first_and_repeat(fn: Callable[[], object]) -> tuple[float, float, object, object]:
    """(first-call seconds, repeat-call seconds, first result, repeat result) of fn, on its own inputs."""
    times, results = [], []
    for _ in range(2):
        sync()
        t0 = time.perf_counter()
        results.append(fn())
        sync()
        times.append(time.perf_counter() - t0)
    return times[0], times[1], results[0], results[1]


def rate_line(name: str, work: float, unit: str, first: float, repeat: float, width: int = 34) -> str:
    """`name: first-call rate, repeat rate, first/repeat` in one line."""
    return (
        f"  {name + ':':<{width}} first call {work / first:10,.1f} {unit}/s ({first:6.2f} s); repeat "
        f"{work / repeat:10,.1f} {unit}/s ({repeat:6.2f} s); first/repeat {repeat / first:4.0%}"
    )
