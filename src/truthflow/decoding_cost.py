"""What generating answers costs on a GPU, priced before a run (`truthflow.pricing` prices a run's answers
with it, and `truthflow.judge_cost` an hf judge's verdicts).

The engine's answers: a decode step reads the weights and every row's KV cache; the step's seconds per byte
are calibrated on the shape's measured answers row (`step_cost`), and the answers of a run are priced step by
step at the context each step reaches (prompt + up to max_new_tokens, every answer running to the cap: a
static batch waits for its longest row) and at the batch the model's batch_size and token budget give
(`decode_batch`).

vLLM's answers (`vllm_answer_seconds`): no vLLM row is measured yet, so they are priced from a stated basis,
the decode roofline at a stated share of the card's datasheet figures (`CARDS`, `VLLM_DECODE_EFFICIENCY`,
`VLLM_FLOP_EFFICIENCY`, `VLLM_START_S`), and always labelled estimated. Continuous batching refills a row
as soon as its answer ends, so an answer costs its own tokens and the batch stays full."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from . import diskplan, judge_cost, registry, sizing
from .answer_backend import backend_for
from .cost_lines import Figure
from .errors import TruthflowError
from .memplan import BYTES, Dims, vllm_plan

# prompt tokens of a question (a chat template adds CHAT_TOKENS); issue 32's answers rows: prompts 16-256
CHAT_TOKENS = 40
BENCH_JOB_PROMPT = 16  # bench_job.py's questions: 6-20 one-id words between BOS, "Q:" and "A:"


def active_params(d: Dims) -> int:
    """Parameters a token passes through: a mixture of experts runs experts_per_token of its experts."""
    return d.params - d.layers * (d.experts - d.experts_per_token) * 3 * d.hidden * d.intermediate


def kv_bytes(d: Dims, dtype: str) -> int:
    """KV-cache bytes of one token over all layers."""
    return 2 * d.layers * d.kv_heads * d.head_dim * BYTES.get(dtype, 2)


def decode_work(d: Dims, dtype: str, batch: int, prompt: float, new: int) -> float:
    """Bytes read per answer over its `new` decode steps at `batch` rows: each step reads the weights (shared
    by the batch) and the row's KV cache of prompt + s tokens: new W / batch + kv (new p + new (new + 1) / 2).
    """
    weights = d.params * BYTES.get(dtype, 2)
    return new * weights / batch + kv_bytes(d, dtype) * (new * prompt + new * (new + 1) / 2)


def decode_batch(batch_size: int, token_budget: int, prompt: float, new: int) -> int:
    """Rows of a generation batch: batch_size, or fewer where rows x (prompt + new) exceeds the budget."""
    return max(1, min(batch_size, int(token_budget // (prompt + new))))


def measured_decode(row: dict) -> tuple[int, float, int]:
    """(batch, mean prompt tokens, new tokens) of a measured answers row, from its settings."""
    settings = row.get("settings", "")
    batch = int(m.group(1)) if (m := re.search(r"batch (\d+)", settings)) else 1
    budget = int(m.group(1)) if (m := re.search(r"token budget (\d+)", settings)) else 32_768
    got = re.search(r"prompts (\d+)-(\d+) tokens", settings)
    prompt = (int(got.group(1)) + int(got.group(2))) / 2 if got else BENCH_JOB_PROMPT
    new = row["max_new_tokens"]
    return decode_batch(batch, budget, prompt, new), prompt, new


def step_cost(rows: list[tuple[Dims, dict]]) -> tuple[float, float]:
    """(seconds per decode step, seconds per byte read) fitted on measured answers rows (least squares over
    their mean step time against the bytes a step reads; one row: no fixed part)."""
    points = []
    for d, row in rows:
        batch, prompt, new = measured_decode(row)
        step = batch / row["samples_per_s"] / new
        points.append((decode_work(d, row.get("dtype", "bfloat16"), batch, prompt, new) * batch / new, step))
    if len(points) == 1:
        ((x, y),) = points
        return 0.0, y / x
    mx, my = (sum(p[i] for p in points) / len(points) for i in (0, 1))
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    fixed = my - slope * mx
    return (fixed, slope) if fixed >= 0 and slope > 0 else (0.0, my / mx)


def answers_seconds(
    d: Dims, dtype: str, batch: int, prompt: float, new: int, cost: tuple[float, float]
) -> float:
    """GPU wall seconds of one answer: its share of `new` decode steps at `batch` rows, each a fixed part
    and the bytes it reads (`step_cost`)."""
    fixed, per_byte = cost
    return new * fixed / batch + per_byte * decode_work(d, dtype, batch, prompt, new)


@dataclass(frozen=True)
class Card:
    """A card's datasheet figures: HBM bytes per second and dense bf16 FLOP/s, and where they are from."""

    hbm_bytes_per_s: float
    flops: float
    source: str


# by the name torch gives the card (throughput.tsv's card column)
CARDS = {
    "NVIDIA H200": Card(4.8e12, 989e12, "H200 SXM datasheet: 4.8 TB/s, 989 TFLOP/s dense bf16"),
    "NVIDIA H100 80GB HBM3": Card(3.35e12, 989e12, "H100 SXM datasheet: 3.35 TB/s, 989 TFLOP/s dense bf16"),
    "NVIDIA A100-SXM4-80GB": Card(2.039e12, 312e12, "A100 80GB SXM datasheet: 2.04 TB/s, 312 TFLOP/s bf16"),
}
# The share of the card's HBM bandwidth a vLLM decode step reaches, from vLLM's published throughput at a
# comparable shape: Llama-3-8B in bf16 on one H100, 256 prompt + 256 new tokens a request, 256 rows at once,
# 44.4 requests/s (vllm-project/vllm pull request 11078, 2024-12, benchmarks/benchmark_throughput.py). Priced
# as below, a request reads 16.1 GB of weights (its 1/256 share of 256 steps) and 12.9 GB of KV cache, and its
# prefill (4.1 TFLOP at VLLM_FLOP_EFFICIENCY) takes 8.3 ms of its 22.5 ms: the decode's 14.2 ms read 29.0 GB,
# 61% of 3.35 TB/s. (12-16k tokens/s for that model at 64 rows on an H100, as issue 48 quotes, is past the
# roofline at 64 rows, 13.4k from the weights alone: it counts prompt tokens or more rows; it bounds nothing.)
VLLM_DECODE_EFFICIENCY = 0.6
# The share of the card's dense bf16 FLOP/s a prefill, or a decode step bound by its FLOPs, reaches: half, a
# round figure below the 60-75% that large bf16 GEMMs reach on Hopper (attention, norms and the scheduler
# add to a step). It weighs little: a QA prompt is 24-80 tokens, a DepthQA prompt about 160.
VLLM_FLOP_EFFICIENCY = 0.5
# A vLLM job's start beside its weights' load (a line of its own): memory profiling, the KV cache,
# torch.compile and CUDA-graph capture; 14.4 s for Llama-3-8B on an H100 with the compile cache warm, 87 s
# compiling two more sizes (the same pull request): a minute
VLLM_START_S = 60.0


def vllm_answer_seconds(
    d: Dims, dtype: str, batch: int, prompt: float, new: float, gpus: int, card: Card
) -> float:
    """Wall seconds of one answer's share of a vLLM job on `gpus` GPUs in tensor parallel (each reads
    1/gpus of the weights and KV cache and does 1/gpus of the FLOPs): its `new` decode steps at `batch` rows,
    each the larger of its bytes (`decode_work`) at VLLM_DECODE_EFFICIENCY of the card's bandwidth and its
    FLOPs (2 x active params a token) at VLLM_FLOP_EFFICIENCY of its FLOP/s; then its prefill, 2 x active
    params x `prompt` FLOPs at VLLM_FLOP_EFFICIENCY (attention's own FLOPs left out: short prompts)."""
    flop_rate = VLLM_FLOP_EFFICIENCY * card.flops
    read = decode_work(d, dtype, batch, prompt, new) / (VLLM_DECODE_EFFICIENCY * card.hbm_bytes_per_s)
    decode = max(read, 2 * active_params(d) * new / flop_rate)
    prefill = 2 * active_params(d) * prompt / flop_rate
    return (decode + prefill) / max(1, gpus)


def vllm_basis(card_name: str, card: Card) -> str:
    """The figures a vLLM answers line is priced on, in the words of the bill's basis."""
    bandwidth, flops = card.hbm_bytes_per_s / 1e12, card.flops / 1e12
    return (
        f"vLLM, no vLLM row measured: each decode step's bytes (weights, KV cache) at "
        f"{VLLM_DECODE_EFFICIENCY:.0%} of {card_name}'s {bandwidth:.2f} TB/s or its FLOPs at "
        f"{VLLM_FLOP_EFFICIENCY:.0%} of {flops:,.0f} TFLOP/s, the larger, then the prefill's FLOPs "
        f"({card.source}; the shares from vLLM's published Llama-3-8B throughput on an H100), "
        f"{VLLM_START_S:.0f} s start a job; batch_size rows at once"
    )


# the model jobs whose answers vLLM may generate (`truthflow.answer_backend`); an hf judge's verdicts too
ANSWER_RULES = ("generate_answers", "answer_depthqa")


def answers_backend(config: dict, rule: str, model: str) -> str:
    """The backend a model job generates with: the config's for `model` (`answer_backend.backend_for`) in an
    answers job, the engine in any other."""
    return backend_for(config, model) if rule in ANSWER_RULES else "engine"


@cache
def released_answer_tokens(path: Path = judge_cost.LENGTHS) -> tuple[float, str] | None:
    """(mean tokens, where from) of the DepthQA authors' released answers: judge_lengths.tsv's answer row over
    the most answers; None where the file is absent."""
    rows = [r for r in sizing.read_rows(path, judge_cost.LENGTH_COLUMNS) if r["text"] == "answer"]
    if not rows:
        return None
    row = max(rows, key=lambda r: int(r["n"]))
    where = f"the mean of the DepthQA authors' {int(row['n']):,} released answers ({row['file']}, "
    return float(row["mean_tokens"]), where + f"{row['tokenizer']} tokens; {path.name})"


@dataclass(frozen=True)
class AnswersPrice:
    """An answers job's GPU-seconds (an hf judge's: a verdict's) on the backend the config names; the engine's
    for the same answers where that is vLLM (None where it is the engine); vLLM's share of each GPU in GiB
    (`memplan.vllm_plan`)."""

    gpu_seconds: Figure
    engine_seconds: Figure | None = None
    vllm_gpu_gib: float | None = None


def engine_basis(step: tuple[float, float]) -> str:
    fixed, per_byte = step
    return (
        f"decode steps of {fixed * 1e3:.1f} ms + bytes read (weights, KV cache) at {1e-9 / per_byte:,.0f} "
        "GB/s, fitted on answers rows"
    )


def no_card(card_name: str) -> str:
    return (
        f"the engine's figures for vLLM's answers: no datasheet figures for {card_name} (decoding_cost.CARDS)"
    )


def answers_price(
    config: dict, name: str, d: Dims, rule: str, dataset: str, card_name: str, step: tuple[float, float]
) -> AnswersPrice:
    """GPU-seconds of an answers job, `rule` of model `name` (dims d) on `dataset`. The engine: every answer
    at the cap, at the batch batch_size and token_budget give (`answers_seconds`). vLLM
    (`vllm_answer_seconds`): at the rows `memplan.vllm_plan` holds (batch_size sequences of prompt +
    max_new_tokens), each answer at its expected length (DepthQA's: the authors' released answers' mean,
    `released_answer_tokens`; a QA set's: the cap, none being measured), plus VLLM_START_S; on a card
    without datasheet figures (`CARDS`), the engine's, saying so."""
    spec = config["models"][name]
    gpus, dtype, n = max(1, int(spec["gpus"])), spec["dtype"], diskplan.dataset_rows(config, dataset)
    new = config["depth"]["max_new_tokens"] if rule == "answer_depthqa" else spec["max_new_tokens"]
    prompt = registry.prompt_tokens(dataset) + (CHAT_TOKENS if spec["chat"] else 0)
    batch = decode_batch(spec["batch_size"], spec["token_budget"], prompt, new)
    text = f"{engine_basis(step)}; the batch configured, {new} new"
    engine = Figure(answers_seconds(d, dtype, batch, prompt, new, step) * n * gpus, False, text)
    if answers_backend(config, rule, name) != "vllm":
        return AnswersPrice(engine)
    card = CARDS.get(card_name)
    if card is None:
        return AnswersPrice(Figure(engine.value, False, f"{text}; {no_card(card_name)}"))
    try:
        plan = vllm_plan(spec, d, math.ceil(prompt + new), int(spec["batch_size"]))
    except TruthflowError as e:
        raise TruthflowError(f"model '{name}': {e}") from None
    tokens, length = float(new), f"every answer at max_new_tokens {new} (no measured length)"
    if rule == "answer_depthqa" and (released := released_answer_tokens()):
        tokens = min(tokens, released[0])
        length = f"answers of {tokens:,.0f} tokens, {released[1]}, at most {new}"
    per = vllm_answer_seconds(d, dtype, plan["rows"], prompt, tokens, gpus, card)
    gpu = Figure((per * n + VLLM_START_S) * gpus, False, f"{vllm_basis(card_name, card)}; {length}")
    return AnswersPrice(gpu, engine, plan["gpu_memory_utilization"] * float(spec["gpu_mem_gb"]))


def verdict_price(
    config: dict, work: judge_cost.HFWork, card_name: str, step: tuple[float, float]
) -> AnswersPrice:
    """GPU-seconds of one verdict of an hf judge (on one GPU): the engine's at the cap, as the answers (no
    basis: `judge_cost.hf_costs` says it); vLLM's at the mean verdict of the released ones
    (`judge_cost.judge_bill`), its job's start shared by the job's verdicts, where the config names vLLM for
    the judge's model (the engine's, saying why, where the card has no datasheet figures)."""
    engine = answers_seconds(work.dims, work.dtype, work.batch, work.prompt, work.new, step)
    if backend_for(config, work.name) != "vllm":
        return AnswersPrice(Figure(engine, False, ""))  # judge_cost.hf_costs says the basis
    card = CARDS.get(card_name)
    if card is None:
        return AnswersPrice(Figure(engine, False, no_card(card_name)))
    tokens = judge_cost.judge_bill(config).output_per_call
    per = vllm_answer_seconds(work.dims, work.dtype, work.batch, work.prompt, tokens, 1, card)
    text = (
        f"{vllm_basis(card_name, card)}; verdicts of {tokens:,.0f} tokens, the mean of the released ones "
        f"({judge_cost.LENGTHS.name}), after a {work.prompt:,.0f}-token prompt on {work.name}'s dims"
    )
    engine_text = f"{engine_basis(step)}; every verdict at the cap, {work.new} new"
    return AnswersPrice(
        Figure(per + VLLM_START_S / work.verdicts, False, text), Figure(engine, False, engine_text)
    )
