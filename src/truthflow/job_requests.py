"""What each job asks its scheduler for, from the figures the bill prints (`truthflow.pricing`): its runtime
is its estimated wall time times a stated margin (an answers job whose backend is vLLM: vLLM's estimate),
its memory the host memory the plan gives it (a model job: `sizing.model_job_mib`, vLLM's processes for
answers vLLM generates; an analysis job: `sizing.requests`), and both grow with Snakemake's `attempt`,
so a job killed at its limit is retried above it. A job whose request would pass the longest runtime the
cluster allows (`cluster.max_runtime_h`) is refused before the run's first job, in one line.

    runtime (min) = min(limit, max(MIN_RUNTIME_MIN, ceil(estimate_s x margin / 60)) x attempt)
    mem_mb        = ceil(planned MiB x MEMORY_GROWTH ** (attempt - 1))

A rule the bill does not price (a table, a plot, a download) keeps the profile's default-resources, which
grow with `attempt` there."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from . import diskplan, registry, sizing
from .answer_backend import backend_for
from .decoding_cost import answers_backend
from .errors import TruthflowError
from .memplan import host_mib, vllm_host_mib
from .pricing import CPU_STAGES, runs_on_cpu

MIN_RUNTIME_MIN = 10  # a job's start, imports and model load never take less than this on a cluster's nodes
# a model job on the CPU (the demo's float32 models): the bill prices it at a GPU's pace, having no CPU
# figures, so its request is this floor (the demo's slowest model job took 3.5 min on a loaded 2-core VM)
CPU_MODEL_RUNTIME_MIN = 60
# an openai judge call's wall seconds: a ~141-token verdict at gpt-4-turbo's ~20 tokens/s and a second of
# latency (an estimate: no call is measured offline)
OPENAI_CALL_S = 8.0
JUDGE_MEM_MB = 2_000  # a judge job without a model: Python, polars and the SDK
# each retry asks for this much more memory than the last: 1.5x covers a peak the plan missed by half
MEMORY_GROWTH = 1.5
# the model jobs: their memory is the memory plan's (loading and passes), by rule
MODEL_RULES = tuple(diskplan.GPU_RULES)


@dataclass(frozen=True)
class Ask:
    """A job's request on its first attempt: runtime in minutes, memory in MiB, and the estimate behind it."""

    runtime_min: int
    mem_mb: int
    estimate_s: float

    def runtime(self, attempt: int, limit_min: int) -> int:
        return min(limit_min, self.runtime_min * max(1, attempt))

    def memory(self, attempt: int) -> int:
        return math.ceil(self.mem_mb * MEMORY_GROWTH ** (max(1, attempt) - 1))


def runtime_minutes(estimate_s: float, margin: float) -> int:
    """The first attempt's runtime: the estimate times the margin, in whole minutes, at least
    MIN_RUNTIME_MIN."""
    return max(MIN_RUNTIME_MIN, math.ceil(estimate_s * margin / 60))


def limit_minutes(config: dict) -> int:
    return int(round(config["cluster"]["max_runtime_h"] * 60))


def asks(config: dict, seconds: Mapping[tuple[str, str, str], float]) -> dict[tuple[str, str, str], Ask]:
    """The request of every model and analysis job by (rule, model, dataset), from its wall seconds
    (`pricing.job_seconds`; a job the bill cannot price asks for MIN_RUNTIME_MIN)."""
    margin = config["cluster"]["runtime_margin"]
    saliency_batch = config["pathways"]["experiments"]["saliency_batch_size"]
    out = {}
    for job in diskplan.jobs(config, seconds):
        rule, model, dataset = job.key
        spec = config["models"][model]
        runtime = runtime_minutes(job.seconds, margin)
        if rule in MODEL_RULES:
            backend = answers_backend(config, rule, model)
            mem = sizing.model_job_mib(spec, diskplan.model_dims(model, spec), saliency_batch, backend)
            runtime = max(runtime, CPU_MODEL_RUNTIME_MIN) if runs_on_cpu(spec) else runtime
        elif rule in CPU_STAGES:
            mem = sizing.requests(config, model, dataset)[rule].mem_mb
        else:
            continue
        out[job.key] = Ask(runtime, mem, job.seconds)
    return out | judge_asks(config, seconds)


def judge_asks(config: dict, seconds: Mapping[tuple[str, str, str], float]) -> dict[tuple, Ask]:
    """judge_answers per judged model: an hf judge is priced as a model job (its verdicts decode as answers
    do: `judge_cost.hf_costs`) and holds its model as one; an openai judge waits on its calls, OPENAI_WORKERS
    at a time, each OPENAI_CALL_S; the reference judge reads a table."""
    from .depth.judge import OPENAI_WORKERS
    from .judge_cost import judge_bill, judge_model, judged_models

    margin, backend = config["cluster"]["runtime_margin"], config["depth"]["judge"]["backend"]
    bill = judge_bill(config) if backend == "openai" else None
    out = {}
    for model in judged_models(config):
        key = ("judge_answers", model, registry.DEPTHQA)
        estimate, mem = seconds.get(key, 0.0), JUDGE_MEM_MB
        if backend == "hf":
            name, spec, _ = judge_model(config)
            spec, dims = {"gpus": 1, **spec}, diskplan.model_dims(name, spec)
            mem = host_mib(spec, dims, 1)
            if backend_for(config, name) == "vllm":  # the engine judges where vLLM refuses the model
                mem = max(mem, vllm_host_mib(spec, dims))
        elif bill is not None:
            estimate = bill.questions * bill.judgments * OPENAI_CALL_S / OPENAI_WORKERS
        out[key] = Ask(runtime_minutes(estimate, margin), mem, estimate)
    return out


def too_long(config: dict, requests: Mapping[tuple[str, str, str], Ask]) -> str | None:
    """Why the run cannot be submitted (its longest job's request passes the cluster's limit), or None."""
    limit = limit_minutes(config)
    over = {key: ask for key, ask in requests.items() if ask.runtime_min > limit}
    if not over:
        return None
    (rule, model, dataset), ask = max(over.items(), key=lambda item: item[1].runtime_min)
    others = f" (and {len(over) - 1} more)" if len(over) > 1 else ""
    return (
        f"job {rule} of {model} on {dataset}{others} is estimated at {ask.estimate_s / 3600:,.1f} h, "
        f"{ask.runtime_min / 60:,.1f} h with the margin {config['cluster']['runtime_margin']:g}, past the "
        f"cluster's {limit / 60:g} h limit (cluster.max_runtime_h): a smaller n for {dataset}, "
        "or cluster.max_runtime_h set to your partition's MaxTime where it allows more "
        "(python -m truthflow.bill prints the estimates)"
    )


def check_runtimes(config: dict, requests: Mapping[tuple[str, str, str], Ask]) -> None:
    if reason := too_long(config, requests):
        raise TruthflowError(reason)


# How the bill prices every rule of the workflow (tests/test_job_requests.py compares this with the rules
# Snakemake lists, so a rule added to the workflow and not here fails it): by its own figures (a model or an
# analysis job, the judge, a model's preparation), as one of the table and plot jobs (pricing.table_jobs), or
# not at all (downloads: the network's time; `all` is a target)
PRICED_BY = {
    **dict.fromkeys(MODEL_RULES, "model job"),
    **dict.fromkeys(CPU_STAGES, "analysis job"),
    "judge_answers": "judge (truthflow.judge_cost)",
    "prepare_model": "weights: download and hash",
    **dict.fromkeys(
        (
            "label_answers",
            "accuracy_table",
            "pathways_tables",
            "experiment_tables",
            "depth_tables",
            "released_metrics",
            "benchmark_table",
            "compare_published",
            "front_page",
            "input_revisions",
            "table_html",
            "plot_pathways",
            "plot_experiments",
            "plot_depth",
        ),
        "table or plot job",
    ),
    **dict.fromkeys(
        ("download_dataset", "download_depthqa", "authors_prompts", "released_answers"),
        "not priced: a download",
    ),
    "all": "not priced: the target",
}
