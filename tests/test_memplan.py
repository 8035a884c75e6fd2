"""The parse-time memory plan (truthflow.memplan) on every model of the two paper configs: the public
dimensions give the published parameter counts and a meta-device build's, the paper configs pass with a plan
for every model, a 70B model on one GPU is refused with the numbers, and derived batch sizes follow the
GPU."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import yaml

from truthflow import memplan
from truthflow.errors import TruthflowError
from truthflow.preflight import prepare_config

REPO = Path(__file__).resolve().parents[1]
PAPERS = {
    p: yaml.safe_load((REPO / "configs" / f"{p}.yaml").read_text()) for p in ("paper-pathways", "paper-depth")
}
ENV = {"OPENAI_API_KEY": "sk-test"}
# published parameter counts (model cards / safetensors metadata), in billions
PUBLISHED = {
    "meta-llama/Llama-3.2-1B": 1.24,
    "meta-llama/Llama-3.2-3B": 3.21,
    "meta-llama/Llama-3.2-3B-Instruct": 3.21,
    "meta-llama/Meta-Llama-3-8B": 8.03,
    "meta-llama/Meta-Llama-3-8B-Instruct": 8.03,
    "meta-llama/Meta-Llama-3-70B": 70.6,
    "meta-llama/Meta-Llama-3-70B-Instruct": 70.6,
    "meta-llama/Llama-2-7b-chat-hf": 6.74,
    "meta-llama/Llama-2-13b-chat-hf": 13.0,
    "meta-llama/Llama-2-70b-chat-hf": 69.0,
    "mistralai/Mistral-7B-v0.1": 7.24,
    "mistralai/Mistral-7B-Instruct-v0.1": 7.24,
    "mistralai/Mistral-7B-Instruct-v0.2": 7.24,
    "mistralai/Mistral-7B-v0.3": 7.25,
    "mistralai/Mistral-7B-Instruct-v0.3": 7.25,
    "mistralai/Mixtral-8x7B-Instruct-v0.1": 46.7,
    "Qwen/Qwen3-8B": 8.19,
    "Qwen/Qwen3-32B": 32.8,
}


def _check(cfg: dict) -> dict:
    return prepare_config(copy.deepcopy(cfg), environ=ENV)


def test_every_paper_model_has_public_dimensions():
    hubs = {m["source"]["hub"] for cfg in PAPERS.values() for m in cfg["models"].values()}
    assert hubs <= set(memplan._table()) and set(memplan._table()) == set(PUBLISHED)


@pytest.mark.parametrize("hub", sorted(PUBLISHED))
def test_parameter_count_is_the_published_and_a_meta_build(hub):
    """The arithmetic count equals a meta-device build from the transformers config class (norms aside)
    and the published size."""
    from transformers import AutoConfig, AutoModelForCausalLM

    dims = memplan._table()[hub]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**dims))
    built = sum(p.numel() for p in model.parameters())
    counted = memplan.Dims.of(dims).params
    assert counted == pytest.approx(built, rel=1e-5)
    assert counted / 1e9 == pytest.approx(PUBLISHED[hub], abs=0.006 * PUBLISHED[hub])


def test_paper_configs_fit_with_a_plan_for_every_model():
    """Both paper configs pass on 80 GiB GPUs as written; every model gets a token budget from the plan
    (the configs set batch_size), and the plan's peaks at those sizes fit."""
    for name, raw in PAPERS.items():
        plans = memplan.fit_to_memory(copy.deepcopy(raw))
        cfg = _check(raw)
        used = set(cfg["pathways"]["models"]) | set(cfg["depth"]["models"])
        assert set(plans) == used, name
        for model, plan in plans.items():
            spec = cfg["models"][model]
            assert spec["batch_size"] == raw["models"][model]["batch_size"]  # given: kept
            assert spec["token_budget"] == plan["token_budget"] >= 8192
            assert plan["generation"] <= 80 and plan["passes"] <= 80, (name, model, plan)
    # a 70B model on two GPUs holds 16384 generation tokens, an 8B one on one GPU 131072
    pw = _check(PAPERS["paper-pathways"])["models"]
    assert pw["llama-3-70b"]["token_budget"] == 16384 and pw["llama-3-8b"]["token_budget"] == 131072


def test_70b_on_one_gpu_is_refused_with_the_numbers():
    cfg = copy.deepcopy(PAPERS["paper-pathways"])
    cfg["models"]["llama-3-70b"]["gpus"] = 1
    with pytest.raises(TruthflowError) as err:
        _check(cfg)
    msg = str(err.value)
    assert "\n" not in msg
    assert "model 'llama-3-70b' cannot fit: predicted peak 140.1 GiB per GPU" in msg
    assert "weights 131.4 GiB over 1 GPU(s), bfloat16" in msg and "the 80 GiB available" in msg
    assert "2 GPUs would hold it" in msg
    cfg["models"]["llama-3-70b"]["gpu_mem_gb"] = 141  # an H200 holds it
    assert _check(cfg)["models"]["llama-3-70b"]["token_budget"] >= 8192


def test_derived_batch_follows_the_gpu_and_a_given_one_is_kept(tmp_path):
    """A local model (its own config.json) without batch_size gets the largest power of two that fits;
    a smaller GPU gives a smaller batch; a batch_size in the config stays as written."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(memplan._table()["Qwen/Qwen3-8B"]))
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["models"] = {"q": {"source": {"local": str(tmp_path / "m")}, "dtype": "bfloat16"}}
    cfg["pathways"]["models"] = cfg["depth"]["models"] = ["q"]
    cfg["figures"] = {}
    for ds in cfg["datasets"].values():
        ds["source"]["local"] = str(REPO / ds["source"]["local"])
    big = _check(cfg)["models"]["q"]
    cfg["models"]["q"]["gpu_mem_gb"] = 24
    small = _check(cfg)["models"]["q"]
    assert big["batch_size"] == memplan.MAX_BATCH and 1 <= small["batch_size"] < big["batch_size"]
    assert small["token_budget"] < big["token_budget"]
    cfg["models"]["q"]["batch_size"] = 7
    assert _check(cfg)["models"]["q"]["batch_size"] == 7


def test_kv_cache_term_is_the_models_own_cache():
    """The KV bytes per token of the plan equal a twin's DynamicCache after a forward (per layer k and v)."""
    from truthflow.twins import build_twin

    lm = build_twin("llama", dtype=torch.bfloat16)
    cfg = lm.model.config
    dims = memplan.Dims.of(cfg.to_dict())
    with torch.no_grad():
        cache = lm.model(torch.arange(3, 40)[None], use_cache=True).past_key_values
    got = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    per_token = memplan.predict(dims, "bfloat16", 1, 1, 1, 1)
    kv = 2 * dims.layers * dims.kv_heads * dims.head_dim * 2
    assert got == kv * 37 and dims.params == pytest.approx(
        sum(p.numel() for p in lm.model.parameters()), rel=0.01
    )
    assert per_token["weights"] * memplan.GIB == dims.params * 2


def test_a_config_json_the_plan_cannot_read_gives_no_plan(tmp_path):
    """A local model whose config.json is not JSON, or has other names for its sizes (GPT-2: n_embd,
    n_layer), gets no derived batch sizes instead of a traceback at parse time."""
    from truthflow.memplan import dims_for

    (tmp_path / "config.json").write_text('{"n_embd": 768, "n_layer": 12, "n_head": 12}')
    assert dims_for("gpt2", {"local": str(tmp_path)}) is None
    (tmp_path / "config.json").write_text("{not json")
    assert dims_for("gpt2", {"local": str(tmp_path)}) is None


def test_vllm_plan_by_hand():
    """Llama-3-8B (8,030,261,248 params: 16,060,522,496 bf16 bytes) on one 80 GiB GPU, 64 sequences of 1,088
    tokens: KV 2 x 32 layers x 8 heads x 128 x 2 bytes = 131,072 a token, x 1,088 x 64 = 9,126,805,504;
    workspace 2.5 GiB (2,684,354,560) + 16,384 tokens x (4 x 4,096 + 3 x 14,336) x 2 bytes (1,946,157,056) +
    2 x 64 rows x 128,256 x 4 bytes (65,667,072) = 4,696,178,688; in all 29,883,506,688 of 85,899,345,920,
    0.34789 -> 0.348.
    Llama-3-70B-Instruct (70,553,706,496 params) on two, 32 sequences of 1,184: weights 70,553,706,496 a
    GPU; KV 327,680 a token, x 1,184 x 32 / 2 GPUs = 6,207,569,920; workspace 2,684,354,560 + 16,384 x (4 x
    8,192 + 3 x 28,672 / 2) x 2 (2,483,027,968) + 2 x 32 x 128,256 x 4 (32,833,536) = 5,200,216,064: past
    0.92, so 0.92 x 85,899,345,920 - both = 3,273,475,686 bytes of KV a GPU, 6,546,951,372 in all, 16 rows
    of 387,973,120 (17 would take 6,595,543,040). On one GPU its weights alone pass it: refused."""
    d8 = memplan.Dims.of(memplan._table()["meta-llama/Meta-Llama-3-8B"])
    plan = memplan.vllm_plan({"gpus": 1, "gpu_mem_gb": 80, "dtype": "bfloat16"}, d8, 1_088, 64)
    assert plan == {
        "gpu_memory_utilization": 0.348,
        "kv_cache_bytes": 9_126_805_504,
        "rows": 64,
        "kv_bytes_per_token": 131_072,
        "weights_bytes": 16_060_522_496,
        "workspace_bytes": 4_696_178_688,
    }
    d70 = memplan.Dims.of(memplan._table()["meta-llama/Meta-Llama-3-70B-Instruct"])
    entry = {"gpus": 2, "gpu_mem_gb": 80, "dtype": "auto"}
    capped = memplan.vllm_plan(entry, d70, 1_184, 32)
    assert (capped["gpu_memory_utilization"], capped["kv_cache_bytes"]) == (0.92, 3_273_475_686)
    assert (capped["workspace_bytes"], capped["rows"]) == (5_200_216_064, 16)
    with pytest.raises(TruthflowError, match="vLLM cannot hold one sequence of 1,184 tokens"):
        memplan.vllm_plan({**entry, "gpus": 1}, d70, 1_184, 32)


def test_a_vllm_jobs_host_memory_by_hand():
    """Its processes at 2.5 GiB each and a 5 GB shard per GPU: Llama-3-70B on 2 GPUs, the job's, the engine
    core and 2 workers: 4 x 2,560 + 2 x 4,768.37 = 19,776.7 -> 19,777 MiB; Llama-3-8B on 1 (the engine core
    runs its worker): 2 x 2,560 + 4,768.37 -> 9,889 MiB, more than the engine's answers job asks."""
    from truthflow import sizing

    d70 = memplan.Dims.of(memplan._table()["meta-llama/Meta-Llama-3-70B-Instruct"])
    assert memplan.vllm_host_mib({"gpus": 2, "dtype": "bfloat16"}, d70) == 19_777
    d8 = memplan.Dims.of(memplan._table()["meta-llama/Meta-Llama-3-8B"])
    spec = {"gpus": 1, "dtype": "bfloat16", "batch_size": 64}
    assert memplan.vllm_host_mib(spec, d8) == 9_889
    assert sizing.model_job_mib(spec, d8, 1, "vllm") == 9_889 > sizing.model_job_mib(spec, d8, 1)
