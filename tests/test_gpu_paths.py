"""GPU code paths proven on a CPU, on the random-weight twins of truthflow.twins (no model preparation):
devices of index tensors on a model spread over GPUs, device assignment of every model load (the HF judge
included), the OOM back-off, non-finite states refused, float32 logits, flash attention, the benchmarks' own
paths, and two guards: host syncs per batch that do not grow with the number of layers (a TorchFunctionMode
counting them), and bf16 against float32 within stated bounds."""

from __future__ import annotations

import collections
import importlib
import itertools
import os
import sys
import weakref
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from conftest import answer_logprobs, knockout_sweep, resid_states
from torch.overrides import TorchFunctionMode

from truthflow import devices
from truthflow.config import schema_defaults
from truthflow.depth import judge
from truthflow.depth.mink import encode_for_scoring, score_texts
from truthflow.engine import Condition, passes
from truthflow.engine import batches as batching
from truthflow.engine.backend import gradient_mode
from truthflow.errors import TruthflowError
from truthflow.generation import build_prompt, generate_answers
from truthflow.models import load_model
from truthflow.pathways import interventions, saliency
from truthflow.twins import SPECIAL, build_twin, save_twin

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
FIRST_BYTE = len(SPECIAL)


pytestmark = pytest.mark.usefixtures("one_thread")


def _rand(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(FIRST_BYTE, FIRST_BYTE + 256, n)]


def _case():
    head = _rand(10, 99)  # a shared chat header: the shared-head paths run too
    seqs = [head + _rand(n - 10, n) for n in (28, 24, 31, 26)]
    ea = [[22, 23, 24], [15], [20, 30], [25]]
    return seqs, ea


def _bench(name: str, monkeypatch):
    """A benchmark script as a module; sys.path (which the scripts extend) is restored after the test."""
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module(name)


# ------------------------------------------------------------------ host syncs
class SyncCounter(TorchFunctionMode):
    """Counts, by name, the calls that make the host wait for the device: device-to-host reads (.item(),
    .tolist(), .cpu(), .numpy(), nonzero, a tensor's truth value...) and host data copied to the device
    (torch.tensor(data, device=...), a tensor indexed with a Python list). On a CPU nothing waits, but the
    calls are the ones a GPU run makes."""

    READS = {
        "item",
        "tolist",
        "cpu",
        "numpy",
        "nonzero",
        "argwhere",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "equal",
        "allclose",
        "unique",
        "masked_select",
    }

    def __init__(self):
        super().__init__()
        self.calls: collections.Counter = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name in self.READS:
            self.calls[name] += 1
        elif name in ("tensor", "as_tensor") and kwargs.get("device") is not None and np.size(args[0]):
            self.calls["tensor(data, device=)"] += 1  # an empty tensor made on a device copies nothing
        elif name in ("__getitem__", "__setitem__") and _has_list(args[1]):
            self.calls["list index"] += 1
        return func(*args, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.calls.values())


def _has_list(index) -> bool:
    return isinstance(index, list) or (isinstance(index, tuple) and any(isinstance(i, list) for i in index))


def _twin_layers(arch: str, n_layers: int):
    types = {
        "gemma3": ["sliding_attention", "full_attention"] * n_layers,
        "qwen3": ["full_attention"] * n_layers,
    }
    extra = {"layer_types": types[arch][:n_layers]} if arch in types else {}
    return build_twin(arch, num_hidden_layers=n_layers, **extra)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("mode", ["cumulative", "window"])
def test_host_syncs_per_knockout_batch_do_not_grow_with_layers(arch, mode):
    """One knockout batch (clean + 2 conditions, a shared prefix cache in cumulative mode): the same syncs
    on a 2-layer and a 6-layer twin. Before: window mode copied every layer's state to the host (2 + 2L)."""
    seqs, _ = _case()
    probes = [len(s) - 1 for s in seqs]
    blocks = [[[12, 13], [14], [15, 16], [12]], [[17], [12, 18], [20], [13]]]
    counts = []
    for n_layers in (2, 6):
        lm = _twin_layers(arch, n_layers)
        with SyncCounter() as sc:
            knockout_sweep(lm, seqs, probes, blocks, 4, mode=mode, window=3)
        counts.append(sc.calls)
    assert counts[0] == counts[1]
    assert counts[0]["cpu"] <= 3  # one copy of each pass's states: clean + 2 conditions


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_host_syncs_per_generation_step_do_not_grow_with_layers(arch):
    """One batch of greedy generation (shared chat head prefilled once, 1 and 4 new tokens): the same syncs
    on a 2-layer and a 6-layer twin, and the same number added by each extra step."""
    counts = {}
    for n_layers in (2, 6):
        lm = _twin_layers(arch, n_layers)
        lm.model.generation_config.eos_token_id = [0]  # never stops early: every row makes every token
        prompts = [build_prompt(lm.tokenizer, q, True) for q in ("Who is A?", "What is the capital of B?")]
        for steps in (1, 4):
            with SyncCounter() as sc:
                generate_answers(lm, prompts, 2, steps, stop_at_newline=False, chat=True)
            counts[n_layers, steps] = sc.total
    assert counts[2, 1] == counts[6, 1] and counts[2, 4] == counts[6, 4], counts


def test_bench_knockout_reference_copies_once_per_batch_not_per_row(monkeypatch):
    """The benchmark's reference builds its block mask as the sweep does (on the host, one copy): its syncs
    per batch do not grow with the rows. Before: one indexed write per row into a device tensor."""
    bench = _bench("bench_knockout", monkeypatch)
    lm = build_twin("llama")
    counts = []
    for n in (2, 8):
        seqs, probe, blocks, _ = bench.make_case(n, 24, 200, 0)  # one batch of n rows
        with SyncCounter() as sc:
            bench.two_pass_reference(lm, seqs, probe, blocks, n)
        counts.append(sc.calls)
    assert counts[0] == counts[1], counts


# ------------------------------------------------------------------ devices
def test_baselines_index_where_the_states_are_not_on_the_first_parameters_device(monkeypatch):
    """A model spread over GPUs (device_map='auto') takes its inputs on the first device and leaves hidden
    states and log-probs on the last; `next(model.parameters())` says nothing about either. Here the first
    parameter sits on 'meta': the baselines still run, with the results of the plain model. Before: index
    tensors (and inputs) were made on the first parameter's device and the pass failed."""
    seqs, ea = _case()
    lm = build_twin("gemma3")
    want_mean, want_low = answer_logprobs(lm, seqs, ea, batch_size=4)
    want_pt = interventions.p_true(lm, seqs, batch_size=4)
    real = lm.model.parameters
    ghost = torch.nn.Parameter(torch.zeros(1, device="meta"))
    monkeypatch.setattr(lm.model, "parameters", lambda recurse=True: itertools.chain([ghost], real(recurse)))
    assert next(lm.model.parameters()).device.type == "meta"
    mean, low = answer_logprobs(lm, seqs, ea, batch_size=4)
    np.testing.assert_array_equal(mean, want_mean)
    np.testing.assert_array_equal(low, want_low)
    np.testing.assert_array_equal(interventions.p_true(lm, seqs, batch_size=4), want_pt)


def test_local_runs_lock_gpus_inside_a_scheduler_allocation(tmp_path):
    """snakemake run locally inside a SLURM allocation of 4 GPUs: each 1-GPU job claims its own device.
    Before: any SLURM_JOB_ID meant 'as is', and every concurrent job took cuda:0."""
    env = {"SLURM_JOB_ID": "42", "CUDA_VISIBLE_DEVICES": "0,1,2,3", devices.LOCK_DIR_ENV: str(tmp_path)}
    try:
        first = devices.assign_devices(1, env=env, count=4)
        assert (first.how, first.indices) == ("lock", [0])
        assert (tmp_path / "gpu-0.lock").exists()
    finally:
        for key in list(devices._HELD):
            devices.release(key)
    # a job that sees exactly what it asked for (a cluster job per rule) uses it as is
    one = {"SLURM_JOB_ID": "42", "CUDA_VISIBLE_DEVICES": "3"}
    assert devices.assign_devices(1, env=one, count=1).how == "as-is"
    # the default lock directory is the allocation's own: another allocation's "0" may be another GPU
    assert devices.default_lock_dir(env) != devices.default_lock_dir({"SLURM_JOB_ID": "43"})
    assert devices.default_lock_dir({}).name.endswith(str(os.getuid()))


@pytest.fixture
def fake_gpu(monkeypatch):
    """A machine with GPUs, as the loading code sees it: CUDA 'available', assign_devices handing out
    cuda:1, from_pretrained recording its arguments and returning a twin whose .to() fails the test."""
    seen: dict = {"assign": [], "load": []}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: None)

    def assign(n_gpus, *a, **k):
        seen["assign"].append(n_gpus)
        return devices.DeviceAssignment("cuda:1", [1], "lock")

    def from_pretrained(source, **kwargs):
        seen["load"].append(kwargs)
        model = build_twin("llama").model
        model.to = lambda *a, **k: pytest.fail(
            f"model.to{a} after loading: the weights went through host RAM"
        )
        return model

    monkeypatch.setattr(devices, "assign_devices", assign)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    return seen


def test_models_load_straight_onto_their_gpu(fake_gpu, tmp_path):
    """One GPU: device_map puts every weight on the job's own device as it is read (Qwen3-32B: 65 GB never
    passes through host RAM). Before: loaded on the CPU, then model.to(device)."""
    save_twin("llama", tmp_path / "m")
    lm = load_model(tmp_path / "m", "float32")
    assert lm.device == "cuda:1" and fake_gpu["assign"] == [1]
    assert fake_gpu["load"][0]["device_map"] == {"": "cuda:1"}


def hf_judge(**given) -> dict:
    """depth.judge with the hf backend, as the workflow fills it."""
    return schema_defaults("depth", "judge", given={"backend": "hf", **given})


def test_hf_judge_from_a_hub_id_gets_its_gpu_like_a_model_job(fake_gpu, tmp_path):
    """A judge named by hub id (here a plain directory: no prepared info file) claims its device through
    devices.assign_devices and loads onto it. Before: .to('cuda'), past the locks, onto whichever GPU."""
    build_twin("llama").tokenizer.save_pretrained(tmp_path / "hub")
    hf = judge.HFJudge(hf_judge(model=str(tmp_path / "hub"), dtype="float32"))
    assert hf.lm.device == "cuda:1" and fake_gpu["assign"] == [1]
    assert fake_gpu["load"][0]["device_map"] == {"": "cuda:1"}


def test_judge_rule_declares_a_gpu_for_the_hf_backend():
    text = (Path(__file__).resolve().parents[1] / "workflow" / "rules" / "depth.smk").read_text()
    rule = text.split("rule judge_answers:")[1].split("\nrule ")[0]
    assert 'gpu=1 if config["depth"]["judge"].get("backend") == "hf" else 0' in rule


def test_hf_judge_turns_qwen3_thinking_off_unless_asked(monkeypatch):
    """Qwen3's template thinks by default, past the verdict's 256 tokens. The judge's prompt writes the empty
    reasoning block (enable_thinking False) unless chat_template_kwargs says otherwise; a template without
    the switch gets no extra variable."""
    row = {"question": "Q?", "answer": "A.", "reference": "R."}

    def prompt(arch, kwargs):
        twin = build_twin(arch)
        monkeypatch.setattr(judge.HFJudge, "_load", lambda self: twin)
        return judge.HFJudge(hf_judge(model="x", chat_template_kwargs=kwargs))._prompt(row)

    assert prompt("qwen3", {}).endswith("<think>\n\n</think>\n\n")
    assert prompt("qwen3", {"enable_thinking": True}).endswith("<|im_start|>assistant\n<think>\n")
    assert prompt("llama", {}).endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_auto_dtype_is_float16_where_the_card_only_emulates_bf16(fake_gpu, tmp_path, monkeypatch):
    """dtype auto on a card without native bf16 (V100, T4) loads float16: there bf16 matmuls are emulated and
    SDPA's memory-efficient kernel refuses bf16, leaving math. Native bf16 (Ampere on): bfloat16. Either
    way the model loads with the attention implementation of the engine's setting. Before: bf16 on every
    card, and from_pretrained got no attn_implementation."""
    save_twin("llama", tmp_path / "m")
    native = {"bf16": False}
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: native["bf16"])
    load_model(tmp_path / "m", "auto")
    native["bf16"] = True
    load_model(tmp_path / "m", "auto", attention="eager")
    load_model(tmp_path / "m", "float32")
    got = [(kw["dtype"], kw["attn_implementation"]) for kw in fake_gpu["load"]]
    assert got == [(torch.float16, "sdpa"), (torch.bfloat16, "eager"), (torch.float32, "sdpa")]


# ------------------------------------------------------------------ OOM back-off
def test_oom_back_off_frees_the_failed_step_before_emptying_the_cache(monkeypatch):
    """empty_cache() can only return memory nobody holds: it runs after the failed step's tensors are gone.
    Before: it ran inside the except block, where the traceback kept the step's frame (and tensors) alive."""
    alive: list[bool] = []
    ref: list = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: alive.append(ref[0]() is not None))

    def step(idx):
        activations = torch.zeros(len(idx), 1000)
        ref[:] = [weakref.ref(activations)]
        if len(idx) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (test)")

    batching.run_batched(list(range(4)), 4, step, desc="t")
    assert alive == [False]


def test_oom_back_off_splits_only_the_failed_batch():
    """After the failed batch's items, the next batch has the full size again: every other batch is the
    one a run without the OOM makes. Before: the halved size held for the rest of the job."""
    sizes = []

    def step(idx):
        sizes.append(len(idx))
        if len(sizes) == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (test)")

    assert batching.run_batched(list(range(12)), 4, step, desc="t") == 2
    assert sizes == [4, 2, 2, 4, 4]


def test_cublas_allocation_failure_is_backed_off():
    """cuBLAS reports a failed workspace allocation as a RuntimeError: a smaller batch cures it as an OOM."""
    sizes = []

    def step(idx):
        sizes.append(len(idx))
        if len(sizes) == 1:
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")

    batching.run_batched(list(range(4)), 4, step, desc="t")
    assert sizes == [4, 2, 2]

    def other(idx):
        raise RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED")

    with pytest.raises(RuntimeError, match="EXECUTION_FAILED"):  # other errors are raised, never retried
        batching.run_batched([0, 1], 2, other, desc="t")


def test_oom_back_off_equals_the_run_without_it():
    """Knockout and Logits-mean with an OOM injected in the first batch against the same call without it:
    every batch after the split one is bit-identical; the split batch's rows differ by float rounding only
    (bound: 1e-5 relative, float32)."""
    lm = build_twin("mistral")
    seqs, ea = _case()
    seqs, ea = seqs * 2, ea * 2  # 8 samples, batches of 4: the OOM splits the first one
    probes = [len(s) - 1 for s in seqs]
    blocks = [[[12, 13], [14], [15, 16], [12]] * 2]
    # each stage's first batch (its own longest-first order): the one the OOM splits
    ends = [max(e) + 1 for e in ea]
    by_length = sorted(range(8), key=lambda i: -len(seqs[i]))[:4]
    firsts = [by_length, by_length, sorted(range(8), key=lambda i: -ends[i])[:4]]

    def run(oom: bool):
        fired = []

        def hook(*_):
            if oom and not fired:
                fired.append(1)
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")

        handle = lm.model.get_input_embeddings().register_forward_pre_hook(hook)
        try:
            clean, kos = knockout_sweep(lm, seqs, probes, blocks, 4)
            fired.clear()
            mean, _ = answer_logprobs(lm, seqs, ea, 4)
        finally:
            handle.remove()
        return [clean, kos[0], mean]

    for got, want, first in zip(run(True), run(False), firsts, strict=True):
        rest = [i for i in range(8) if i not in first]
        np.testing.assert_array_equal(got[rest], want[rest])
        np.testing.assert_allclose(got[first], want[first], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ state storage, flash attention
def test_states_that_are_not_finite_are_refused_with_one_line():
    """A float32 model's residual values past float16's 65,504 go into the engine's own (float32) arrays as
    they are; a value past the range of a narrower array a caller gives, or the model's own inf or NaN, stops
    the stage with one line naming it (model/dataset) and the condition. Before: inf went to disk."""
    lm = build_twin("llama")
    with torch.no_grad():
        lm.model.model.layers[-1].mlp.down_proj.weight.mul_(1e5)
    seqs, _ = _case()
    probes = [len(s) - 1 for s in seqs]
    (clean,) = resid_states(lm, seqs, probes, [Condition()], 4)
    assert clean.dtype == np.float32 and np.abs(clean).max() > 65504 and np.isfinite(clean).all()
    ko = Condition(block=[[12]] * 4, name="resid_ko")
    narrow = [np.zeros(clean.shape, np.float16)]
    with pytest.raises(
        TruthflowError,
        match=r"knockout twin/popqa: resid_ko: a residual value of \|x\| = [0-9,]+ is past the range of the "
        r"float16 array",
    ) as err:
        resid_states(lm, seqs, probes, [ko], 4, out=narrow, desc="knockout twin/popqa")
    assert "\n" not in str(err.value)
    with torch.no_grad():
        lm.model.model.layers[-1].mlp.down_proj.weight.mul_(1e35)  # past float32's range: inf
    with pytest.raises(
        TruthflowError, match="PR twin/popqa: condition 0: the model computed [0-9,]+ inf or NaN"
    ):
        resid_states(lm, seqs, probes, [Condition()], 4, layer=3, desc="PR twin/popqa")


def test_flash_attention_is_refused_where_a_4d_mask_is_needed():
    """Flash attention reads a mask as padding only: a knockout under it would block nothing. The stages
    with an additive 4D mask stop with one line (clean passes take a padding mask, which flash reads)."""
    lm = build_twin("llama")
    lm.model.config._attn_implementation = "flash_attention_2"
    seqs, ea = _case()
    probes = [len(s) - 1 for s in seqs]
    for call in (
        lambda: knockout_sweep(lm, seqs, probes, [[[12]] * 4], 4),
        lambda: resid_states(lm, seqs, probes, [Condition()], 4, layer=2),
    ):
        with pytest.raises(
            TruthflowError, match="attention 'flash_attention_2' cannot apply the additive 4D"
        ):
            call()


# ------------------------------------------------------------------ float32 logits of a bf16 model
@contextmanager
def _final_norm_inputs(model):
    """The residual streams [B, T, D] the final norm receives in the base model's passes during the block,
    in call order (float_logits' own calls of the norm, on [N, D] rows, are left out)."""
    kept: list[torch.Tensor] = []

    def keep(_m, args, _o):
        if args[0].dim() == 3:
            kept.append(args[0].detach().clone())

    handle = getattr(model, model.base_model_prefix).norm.register_forward_hook(keep)
    try:
        yield kept
    finally:
        handle.remove()


@torch.no_grad()
def _reference_logprobs(model, resid: torch.Tensor) -> torch.Tensor:
    """float64 log-probs [T, V] of one row's residual stream [T, D] (as the bf16 model computed it): the
    model's own final norm on a float64 input (float32 inside), then the head and the soft-cap in float64."""
    x = getattr(model, model.base_model_prefix).norm(resid.double()).double()
    logits = x @ model.get_output_embeddings().weight.double().T
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return torch.log_softmax(logits, -1)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen3"])
def test_bf16_log_probs_are_not_rounded_to_bf16(arch, monkeypatch):
    """Logits-mean/min, P(True) and MIN-K% of a bf16 twin equal float64 log-probabilities of the very
    residual stream its pass made (1e-4): the final norm and the head run in float32. Before: the head's
    bf16 output was upcast, off by up to |logit| x 2^-9 (about 1e-2 here)."""
    lm = build_twin(arch, dtype=torch.bfloat16)
    monkeypatch.setattr(batching, "MIN_SHARED_PREFIX", 10**9)  # one full pass per row: one residual per row
    seqs, ea = _case()
    ends = [max(e) + 1 for e in ea]
    with _final_norm_inputs(lm.model) as kept:
        mean, low = answer_logprobs(lm, seqs, ea, 1)
    for k, i in enumerate(sorted(range(len(seqs)), key=lambda i: -ends[i])):
        lp = _reference_logprobs(lm.model, kept[k][0])
        vals = np.array([lp[p - 1, seqs[i][p]].item() for p in ea[i]])
        assert (mean[i], low[i]) == pytest.approx((vals.mean(), vals.min()), abs=1e-4)
    t_ids, f_ids = interventions.verdict_token_ids(lm.tokenizer)
    with _final_norm_inputs(lm.model) as kept:
        pt = interventions.p_true(lm, seqs, 1)
    for k, i in enumerate(sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))):
        lp = _reference_logprobs(lm.model, kept[k][0])
        lt, lf = torch.logsumexp(lp[-1, t_ids], 0), torch.logsumexp(lp[-1, f_ids], 0)
        assert pt[i] == pytest.approx(torch.sigmoid(lt - lf).item(), abs=1e-4)
    text = "What is a proton gradient and why does it matter?"
    with _final_norm_inputs(lm.model) as kept:
        got = score_texts(lm, [text], [20, 100], 1).row(0, named=True)
    ids = encode_for_scoring(lm.tokenizer, text)
    lp = _reference_logprobs(lm.model, kept[0][0])
    token = lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
    assert got["mink_100"] == pytest.approx(-token.mean(), abs=1e-4)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_bf16_saliency_log_probs_use_the_float32_head(arch, monkeypatch):
    """Logits-mean/min as the workflow reads them off the saliency pass of a bf16 twin equal float64
    log-probabilities of the residual stream that pass made (1e-4), as the separate pass's do above."""
    lm = build_twin(arch, dtype=torch.bfloat16)
    monkeypatch.setattr(batching, "MIN_SHARED_PREFIX", 10**9)  # one full pass per row
    seqs, ea = _case()
    starts = [min(e) for e in ea]
    eq = [[11, 12]] * len(seqs)
    with _final_norm_inputs(lm.model) as kept:  # per pass: the (replaced) norm call, then the loss's own
        got = saliency.saliency(lm, seqs, starts, eq, ea, 1)
    for k, i in enumerate(sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))):
        lp = _reference_logprobs(lm.model, kept[2 * k][0])
        vals = np.array([lp[p - 1, seqs[i][p]].item() for p in ea[i]])
        assert (got.logit_mean[i], got.logit_min[i]) == pytest.approx((vals.mean(), vals.min()), abs=1e-4)


# ------------------------------------------------------------------ guard: bf16 against float32
# Bounds, stated: a bf16 twin (the float32 twin's weights rounded to bf16) against the float32 twin, on the
# same inputs, every stage as the workflow runs it. The bf16 forward itself (8-bit mantissas in every layer)
# sets them; the measured maxima over the four twins (about half of each bound) were: log-probabilities and
# MIN-K%/Min-K%++ 0.071 (Mistral's Min-K%++ z), P(True) 0.0046, the saliency loss 0.2% relative, residual
# streams 2.4% of their largest value.
BF16_BOUNDS = {"log_prob_or_z": 0.15, "p_true": 0.01, "saliency_loss_rel": 0.005, "resid_rel": 0.05}


@pytest.mark.parametrize("arch", ["llama", "gemma3", "mistral", "qwen3"])
def test_bf16_against_float32_within_the_stated_bounds(arch):
    seqs, ea = _case()
    probes = [len(s) - 1 for s in seqs]
    starts = [20, 14, 20, 22]
    out = {}
    for name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        lm = build_twin(arch, dtype=dtype)
        mean, low = answer_logprobs(lm, seqs, ea, 4)
        mink = score_texts(lm, ["Why does the Central Limit Theorem need independence?"], [20], 1)
        clean, kos = knockout_sweep(lm, seqs, probes, [[[12, 13]] * 4], 4)
        with gradient_mode(lm.model):
            loss = float(passes.attention_and_grads(lm, seqs, starts, 0)[0])
        lp = np.concatenate([mean, low, mink.select("mink_20", "minkpp_20").to_numpy()[0]])
        out[name] = {
            "lp": lp,
            "pt": interventions.p_true(lm, seqs, 4),
            "loss": loss,
            "resid": np.stack([clean, kos[0]]),
        }
    f, b = out["f32"], out["bf16"]
    assert np.abs(b["lp"] - f["lp"]).max() <= BF16_BOUNDS["log_prob_or_z"]
    assert np.abs(b["pt"] - f["pt"]).max() <= BF16_BOUNDS["p_true"]
    assert abs(b["loss"] - f["loss"]) <= BF16_BOUNDS["saliency_loss_rel"] * abs(f["loss"])
    assert np.abs(b["resid"] - f["resid"]).max() <= BF16_BOUNDS["resid_rel"] * np.abs(f["resid"]).max()


# ------------------------------------------------------------------ benchmarks
@pytest.fixture
def bench_depth(monkeypatch):
    """benchmarks/bench_depth.py, with everything its main() overwrites put back afterwards."""
    from truthflow import generation
    from truthflow.depth import mink

    bench = _bench("bench_depth", monkeypatch)
    monkeypatch.setattr(mink, "encode_for_scoring", mink.encode_for_scoring)
    monkeypatch.setattr(generation, "encode_prompt", generation.encode_prompt)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    return bench


def test_bench_depth_runs_the_demo_models_with_their_chat_setting(bench_depth, monkeypatch, capsys, tmp_path):
    """The demo path scores MIN-K% of config.yaml's depth models in-process, then hands their answer_depthqa
    jobs to bench_answers with the repeat; a job's params take the model's chat flag from config.yaml
    (smollm2: chat, gemma3: base)."""
    import polars as pl

    monkeypatch.chdir(BENCH.parent)  # main() moves to the checkout: back where the test began afterwards
    loaded, compared = [], []
    questions = tmp_path / "depthqa.parquet"
    pl.DataFrame({"question": ["Who wrote Hamlet?", "Why is the sky blue?"]}).write_parquet(questions)

    def load(path, dtype, attention="auto"):
        loaded.append(Path(path).name)
        return build_twin("llama")

    def inputs(config, jobs, folder, models_dir):
        return {"depthqa": questions, **{m: Path(models_dir) / m for _, m, _ in jobs}}

    monkeypatch.setattr("truthflow.models.load_model", load)
    monkeypatch.setattr(bench_depth.bench_answers, "prepare_inputs", inputs)
    monkeypatch.setattr(bench_depth.bench_answers, "compare", lambda *a, **k: compared.append((a, k)))
    monkeypatch.setattr(sys, "argv", ["bench_depth.py", "--n", "2"])
    bench_depth.main()
    assert loaded == ["smollm2-135m", "gemma3-270m"]
    assert capsys.readouterr().out.count("score_mink 2 questions") == 2
    (config, jobs, backends, paths, folder, cores), options = compared[0]
    assert [j[1] for j in jobs] == loaded and list(backends) == ["engine", "vllm"] and options["repeat"]
    specs = [bench_depth.bench_answers.job_spec(config, j, "vllm", paths, folder, cores) for j in jobs]
    chat = {spec["wildcards"]["model"]: spec["params"]["chat"] for spec in specs}
    assert chat == {"smollm2-135m": True, "gemma3-270m": False}


def test_bench_depth_runs_a_random_shape(bench_depth, monkeypatch, capsys):
    """--shape: the stand-in tokenizer has what the newline stop reads (backend_tokenizer.decode_batch).
    Before: an AttributeError in generation.newline_token_ids."""
    monkeypatch.setattr(
        sys, "argv", ["bench_depth.py", "--shape", "tiny", "--n", "3", "--max-new-tokens", "2"]
    )
    bench_depth.main()
    assert "answer_depthqa 3 answers" in capsys.readouterr().out


def test_qwen3_32b_shape_has_qwen3_32bs_parameters(monkeypatch):
    shapes = _bench("shapes", monkeypatch)
    lm = shapes.random_model("qwen3-32b", device="meta")
    n = sum(p.numel() for p in lm.model.parameters())
    assert 32.7e9 < n < 32.9e9 and lm.info["n_layers"] == 64  # Qwen3-32B: 32.8B parameters


# ------------------------------------------------------------------ gpu_smoke's bounds can fail
def test_gpu_smoke_exactness_check_fails_on_a_wrong_knockout(monkeypatch):
    """gpu_smoke bounds the one-pass knockout by the dtype's tolerance or twice the clean paths' rounding
    noise: a knockout that blocked nothing fails that check (on the tiny shape, float32: noise 0, so the bound
    is 1e-4)."""
    smoke = _bench("gpu_smoke", monkeypatch)
    shapes = _bench("shapes", monkeypatch)
    lm = shapes.random_model("tiny", "float32", "cpu")
    assert smoke.stage_extraction(lm, 8, "float32")[1].startswith("8 samples")  # passes as it is
    assert "eager attention backward" in smoke.stage_saliency(lm, 8)

    real_sweep = smoke.sweep

    def blocks_nothing(lm, seqs, probe, blocks, batch_size):
        clean, *kos = real_sweep(lm, seqs, probe, blocks, batch_size)
        return [clean, *(clean.copy() for _ in kos)]

    monkeypatch.setattr(smoke, "sweep", blocks_nothing)
    with pytest.raises(AssertionError, match="one-pass vs per-layer knockout"):
        smoke.stage_extraction(lm, 8, "float32")
