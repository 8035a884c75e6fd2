"""Memory plan: each model job's peak memory per GPU predicted from its config.json (no torch) and checked
against the config's GPUs before any job runs; the batch sizes that fill them. Dimensions: a `local:` source's
config.json, else schemas/model_dims.yaml, else the prepared model's config.json, checked only (a value
derived from it would change once the model is prepared, rerunning jobs). `predict`, per GPU (g GPUs: 1/g of
the layers): weights, KV cache, one layer's activations, the knockout's 4D mask, saliency's attention maps and
graph, a fixed share; `generation` at token_budget tokens, `passes` (knockout, experiments, score_mink) and
`saliency` at batch_size / saliency_batch_size rows of ROW_TOKENS tokens. A model whose one-row jobs exceed
gpu_mem_gb is refused; batch_size and token_budget, where left out, become the largest powers of two filling
at most HEADROOM of what the weights leave. Answers that vLLM generates: its share of each GPU (`vllm_plan`)
and the host memory of its processes (`vllm_host_mib`)."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path

import yaml

from .config import fill_defaults
from .errors import TruthflowError

DIMS_FILE = Path(__file__).resolve().parent / "schemas" / "model_dims.yaml"
GIB = 2**30
BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "auto": 2}  # auto: bf16 on a GPU
ROW_TOKENS = 256  # tokens of a planned row: a QA prompt and its answer, a DepthQA question (most are < 128)
HEAD_GIB = 0.625  # float32 logits chunks (mink: 2^25 elements, three live), the head's conversion chunk
OVERHEAD_GIB = 1.5  # CUDA context, cuBLAS/cuDNN workspaces
HEADROOM = 0.9  # share of the memory left beside the weights that a planned batch may fill
JOB_RAM_GIB = 2.5  # torch and the CUDA libraries in a model job's process
SHARD_BYTES = 5e9  # from_pretrained loads one safetensors shard at a time (the hub's shards are <= 5 GB)
# a model job without the model's dimensions (not prepared yet, not in model_dims.yaml): what a 1B model asks
UNSIZED_HOST_GIB = 8.0
MAX_BATCH = 256
# vLLM (`vllm_plan`): beside the weights and the KV cache, its share of a GPU holds the CUDA context and
# cuBLAS workspaces (OVERHEAD_GIB), its CUDA graphs and NCCL buffers (VLLM_GRAPHS_GIB, a round figure), the
# activations of the step its memory profiling runs, VLLM_BATCHED_TOKENS tokens (vLLM 0.32's
# max_num_batched_tokens for offline runs on H100/H200-class cards, engine/arg_utils.py), and the sampler's
# float32 logits; and never more than VLLM_MAX_UTILIZATION of the GPU (vLLM 0.32's own default
# gpu_memory_utilization, config/cache.py)
VLLM_GRAPHS_GIB = 1.0
VLLM_BATCHED_TOKENS = 16_384
VLLM_MAX_UTILIZATION = 0.92
MAX_BUDGET = 2**18
DERIVED = ("batch_size", "token_budget")  # from the plan where the config leaves them out


def compute_dtype(spec: dict) -> str:
    """The dtype a model's jobs compute in, as planned before any job (`models.resolve_dtype` decides at
    load): its dtype, auto as bfloat16 (a GPU's from Ampere on; an older card's float16 has its bytes); with
    gpus 0 float32, which a CPU loads auto and float16 as, and bfloat16 too without AVX512-BF16 (the
    larger)."""
    if int(spec.get("gpus", 1)) == 0:
        return "float32"
    return "bfloat16" if spec.get("dtype", "auto") == "auto" else spec["dtype"]


@dataclass(frozen=True)
class Dims:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = False
    experts: int = 1
    experts_per_token: int = 1

    @classmethod
    def of(cls, cfg: dict) -> Dims:
        """From a config.json (a multimodal one's text_config)."""
        cfg = cfg.get("text_config") or cfg
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        return cls(
            layers=int(cfg["num_hidden_layers"]),
            hidden=hidden,
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate=int(cfg["intermediate_size"]),
            vocab=int(cfg["vocab_size"]),
            tied=bool(cfg.get("tie_word_embeddings", False)),
            experts=int(cfg.get("num_local_experts") or 1),
            experts_per_token=int(cfg.get("num_experts_per_tok") or 1),
        )

    @property
    def params(self) -> int:
        attn = self.hidden * self.head_dim * 2 * (self.heads + self.kv_heads)  # q, o; k, v
        router = self.hidden * self.experts if self.experts > 1 else 0
        mlp = self.experts * 3 * self.hidden * self.intermediate + router
        per_layer = attn + mlp + 2 * self.hidden  # two norms
        return self.layers * per_layer + self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden


def layer_activations(m: Dims, gpus: int = 1) -> float:
    """Elements of one layer's activations per token on one GPU: the residual, norm and attention outputs
    (4 x hidden) and the MLP's gate, up and their product (3 x intermediate, per expert a token runs), the
    MLP's split over `gpus` in tensor parallel (vLLM; the engine places whole layers on a GPU)."""
    return 4 * m.hidden + 3 * m.intermediate * m.experts_per_token / gpus


def predict(m: Dims, dtype: str, gpus: int, batch: int, budget: int, saliency_batch: int) -> dict[str, float]:
    """Peak GiB per GPU of each job kind, and the weights' share."""
    b = BYTES.get(dtype, 2)  # bytes per weight and per activation element
    g = max(1, gpus)  # each GPU holds 1/g of the layers
    t = ROW_TOKENS
    weights = m.params * b / g
    base = (HEAD_GIB + OVERHEAD_GIB) * GIB + weights  # of every job: the fixed share and the weights
    act = layer_activations(m)
    per_token = 2 * m.layers * m.kv_heads * m.head_dim * b / g + act * b  # + KV cache
    saved = act + 2 * (m.heads + 2 * m.kv_heads) * m.head_dim  # what the backward keeps per token and layer
    # saliency: all layers' eager attention probabilities [B, H, T, T] and gradients at once, the saved
    # activations, one layer's float32 softmax
    probs = 2 * m.layers * m.heads * t * t * b
    saliency = saliency_batch * ((probs + m.layers * t * saved * b) / g + m.heads * t * t * 4)
    peak_bytes = {
        "weights": weights,
        "generation": base + budget * per_token,
        "passes": base + batch * t * per_token + batch * t * t * b,  # + the 4D mask
        "saliency": base + saliency,
    }
    return {k: v / GIB for k, v in peak_bytes.items()}


def host_mib(spec: dict, dims: Dims | None, saliency_batch: int = 1) -> int:
    """Host memory (MiB) of a model job, what its SLURM request and the bill's RAM column give: torch and the
    CUDA libraries, and the weights as they load: on a GPU one safetensors shard at a time (the rest goes to
    the GPU); on the CPU (compute dtype float32) every weight and the largest job's activations, as `predict`
    sizes a GPU's. Unknown dimensions: UNSIZED_HOST_GIB."""
    if dims is None:
        return math.ceil(UNSIZED_HOST_GIB * 1024)
    dtype = compute_dtype(spec)
    if dtype == "float32":  # the CPU setting (gpus 0, or float32 weights: pricing.runs_on_cpu)
        peaks = predict(dims, dtype, 1, spec["batch_size"], spec["token_budget"], saliency_batch)
        loaded = max(v for k, v in peaks.items() if k != "weights") * GIB
    else:
        loaded = min(SHARD_BYTES, dims.params * BYTES.get(dtype, 2))
    return math.ceil((JOB_RAM_GIB * GIB + loaded) / 2**20)


def vllm_host_mib(spec: dict, dims: Dims | None) -> int:
    """Host memory (MiB) of a job whose answers vLLM generates: on a GPU, its processes (the job's own with
    vLLM's front end, vLLM's engine core, and with tensor parallelism a worker per GPU; each holds torch and
    the CUDA libraries, JOB_RAM_GIB) and one safetensors shard per GPU as its worker loads it (the weights go
    to the GPU); on the CPU, where vLLM runs in the job's process with every weight in host memory, what an
    engine job there holds (`host_mib`)."""
    if dims is None or compute_dtype(spec) == "float32":
        return host_mib(spec, dims)
    gpus = max(1, int(spec["gpus"]))
    processes = 2 + (gpus if gpus > 1 else 0)
    shard = min(SHARD_BYTES, dims.params * BYTES.get(compute_dtype(spec), 2))
    return math.ceil((processes * JOB_RAM_GIB * GIB + gpus * shard) / 2**20)


def vllm_plan(model_entry: dict, dims: Dims, max_model_len: int, batch: int) -> dict:
    """vLLM's memory on each of the model's GPUs for `batch` sequences of max_model_len tokens at once: the
    weights (1/gpus each), the KV cache (2 x layers x KV heads x head size x dtype bytes a token; the KV heads
    split over the GPUs) and a workspace (OVERHEAD_GIB, VLLM_GRAPHS_GIB, one profiling step's activations of
    VLLM_BATCHED_TOKENS tokens, the sampler's float32 logits of every row, twice), as a share of gpu_mem_gb:

    - gpu_memory_utilization: that share, rounded up to a thousandth, at most VLLM_MAX_UTILIZATION
    - kv_cache_bytes: the KV cache per GPU the plan gives (what vLLM's kv_cache_memory_bytes takes: per GPU)
    - rows: the sequences of max_model_len tokens that cache holds (batch, fewer where the cap binds)
    - kv_bytes_per_token (the whole model's), weights_bytes and workspace_bytes (per GPU)

    A plan whose cap leaves no room for one sequence is refused in one line."""
    gpus = max(1, int(model_entry["gpus"]))
    b = BYTES.get(compute_dtype(model_entry), 2)
    memory = float(model_entry["gpu_mem_gb"]) * GIB
    weights = math.ceil(dims.params * b / gpus)
    per_token = 2 * dims.layers * dims.kv_heads * dims.head_dim * b
    splits = min(gpus, dims.kv_heads)  # past kv_heads GPUs, vLLM repeats a KV head on several
    workspace = math.ceil(
        (OVERHEAD_GIB + VLLM_GRAPHS_GIB) * GIB
        + VLLM_BATCHED_TOKENS * layer_activations(dims, gpus) * b
        + 2 * batch * dims.vocab * 4
    )
    kv = math.ceil(per_token * max_model_len * batch / splits)
    share = (weights + kv + workspace) / memory
    if share > VLLM_MAX_UTILIZATION:
        kv, share = math.floor(VLLM_MAX_UTILIZATION * memory - weights - workspace), VLLM_MAX_UTILIZATION
    rows = min(batch, max(0, kv) * splits // (per_token * max_model_len))
    if rows < 1:
        raise TruthflowError(
            f"vLLM cannot hold one sequence of {max_model_len:,} tokens: weights of {weights / GIB:.1f} GiB "
            f"and a workspace of {workspace / GIB:.1f} GiB per GPU leave no KV cache in "
            f"{VLLM_MAX_UTILIZATION:.0%} of {memory / GIB:g} GiB (the model's gpus, gpu_mem_gb)"
        )
    return {
        "gpu_memory_utilization": min(VLLM_MAX_UTILIZATION, math.ceil(share * 1000) / 1000),
        "kv_cache_bytes": kv,
        "rows": rows,
        "kv_bytes_per_token": per_token,
        "weights_bytes": weights,
        "workspace_bytes": workspace,
    }


@cache
def _table() -> dict:
    return yaml.safe_load(DIMS_FILE.read_text())


def dims_for(name: str, source: dict) -> tuple[Dims, bool] | None:
    """(dims, whether batch sizes may be derived from them), or None where nothing is known."""
    local = Path(source.get("local", ""), "config.json")
    prepared = Path("resources", "models", name, "config.json")
    if "local" in source and not source.get("gguf_file") and local.is_file():
        path, derive = local, True
    elif source.get("hub") in _table():
        return Dims.of(_table()[source["hub"]]), True
    elif "hub" in source and prepared.is_file():
        path, derive = prepared, False
    else:
        return None
    try:
        return Dims.of(json.loads(path.read_text())), derive
    except (ValueError, KeyError, TypeError):  # not JSON, or not the keys a plan reads (GPT-2's n_embd, …)
        return None


def _largest(fits, low: int, high: int) -> int:
    """The largest power of two in [low, high] that fits (low where none does)."""
    powers = (low << i for i in range(high.bit_length()))
    return max((x for x in powers if x <= high and fits(x)), default=low)


def plan_model(name: str, spec: dict, dims: Dims, jobs: set[str], saliency_batch: int) -> dict:
    """Refuse `name` if its smallest jobs exceed the GPU; else the fitting batch sizes and the peaks."""
    mem = float(spec["gpu_mem_gb"])
    gpus = int(spec["gpus"])
    dtype = spec["dtype"]
    at = partial(predict, dims, dtype, gpus)  # (batch, budget, saliency_batch) on the config's GPUs

    def smallest(g: int) -> float:
        return max(v for k, v in predict(dims, dtype, g, 1, ROW_TOKENS, 1).items() if k in jobs)

    if smallest(gpus) > mem:
        need = next((g for g in range(gpus + 1, 65) if smallest(g) <= mem), None)
        weights = at(1, 1, 1)["weights"]
        hint = f"; {need} GPUs would hold it (models.{name}.gpus)" if need else ""
        raise TruthflowError(
            f"model '{name}' cannot fit: predicted peak {smallest(gpus):.1f} GiB per GPU (weights "
            f"{weights:.1f} GiB over {gpus} GPU(s), {dtype}) exceeds the {mem:g} GiB available "
            f"(models.{name}.gpu_mem_gb){hint}"
        )
    fixed = at(0, 0, 0)["generation"]  # weights, head, overhead
    cap = fixed + HEADROOM * (mem - fixed)

    def batch_fits(batch: int) -> bool:
        return at(batch, ROW_TOKENS, 1)["passes"] <= cap

    def budget_fits(budget: int) -> bool:
        return at(1, budget, 1)["generation"] <= cap

    batch = spec.get("batch_size") or _largest(batch_fits, 1, MAX_BATCH)
    budget = spec.get("token_budget") or _largest(budget_fits, ROW_TOKENS, MAX_BUDGET)
    peaks = at(batch, budget, saliency_batch)
    job_peaks = {k: peaks[k] for k in ("weights", *sorted(jobs))}
    return {
        "batch_size": batch,
        "token_budget": budget,
        "params": dims.params,
        "smallest": smallest(gpus),
        **job_peaks,
    }


def fit_to_memory(config: dict, full: dict | None = None) -> dict[str, dict]:
    """plan_model per model of a checked, unfilled config; sets the batch sizes left out where derivable."""
    full = fill_defaults(copy.deepcopy(config)) if full is None else full
    pw = full["pathways"]
    plans = {}
    for name, given in config["models"].items():
        spec = {k: v for k, v in full["models"][name].items() if k in given or k not in DERIVED}
        used = name in pw["models"] or name in full["depth"]["models"]
        found = dims_for(name, spec["source"]) if used and spec["gpus"] else None
        if found is None:
            continue
        dims, derive = found
        jobs = {"generation", "passes"}
        if name in pw["models"]:  # only the pathways experiments run the saliency pass
            jobs.add("saliency")
        plan = plan_model(name, spec, dims, jobs, pw["experiments"]["saliency_batch_size"])
        plans[name] = plan
        if derive:
            for key in DERIVED:
                given.setdefault(key, plan[key])
    return plans
