"""The attention kernel each of the engine's passes runs, read from torch.profiler's op and kernel names:
the kernels `engine.backend.probe` names in the load log are the ones the engine's real passes run (a clean
padded pass, the knockout's 4D mask, generation's prefill and one-token decode steps), no pass runs cuDNN
attention, and saliency runs eager attention (no SDPA call). On a CPU the same assertions read the CPU
kernels (flash_attention_for_cpu, math); with a CUDA device the `gpu` variant reads the GPU's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from truthflow.engine import Condition, Resid, backend, run
from truthflow.generation import build_prompt, generate_answers
from truthflow.pathways import interventions, saliency
from truthflow.twins import SPECIAL, build_twin

pytestmark = pytest.mark.usefixtures("one_thread")

FIRST_BYTE = len(SPECIAL)
NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, NEEDS_CUDA])]
# the kernels each setting may run on each device, per kind of pass (the probe's cases): on a GPU, `auto`
# runs flash where no mask is needed (a sliding-window layer, as Gemma-3's, takes a mask even there) and the
# memory-efficient kernel under any mask; math would mean a mask or a dtype no fused kernel takes. A CPU
# has one fused kernel (flash_attention_for_cpu), which takes masks.
EXPECTED = {
    ("cpu", "auto"): dict.fromkeys(backend.CASES, {"flash"}),
    ("cpu", "math"): dict.fromkeys(backend.CASES, {"math"}),
    ("cuda", "auto"): {
        "pass without padding": {"flash", "efficient"},
        "padded batch": {"efficient"},
        "pass with a 4D mask": {"efficient"},
        "one-token decode step": {"efficient"},
    },
    ("cuda", "math"): dict.fromkeys(backend.CASES, {"math"}),
}


def _rows(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(FIRST_BYTE, FIRST_BYTE + 256, n)]


def _twin(arch: str, device: str, choice: str):
    lm = build_twin(arch, dtype=torch.float32 if device == "cpu" else torch.bfloat16)
    lm.model.to(device)
    lm.attention = choice
    return lm


def _case():
    head = _rows(10, 99)  # a shared head: the shared-prefix paths (the head's own pass, unpadded) run too
    return [head + _rows(n - 10, n) for n in (28, 24, 31, 26)]


def _passes(lm) -> dict[str, tuple[tuple[str, ...], object]]:
    """Each path of the engine a model job takes: (the probe's cases it makes, a call that runs it)."""
    seqs = _case()
    probes = [len(s) - 1 for s in seqs]
    knockout = [Condition(), Condition(block=[[12, 13], [14], [15, 16], [12]])]
    prompts = [build_prompt(lm.tokenizer, q, True) for q in ("Who is A?", "What is the capital of B?")]
    no_pad, padded, masked, step = backend.CASES
    return {
        "P(True), clean padded pass": ((no_pad, padded), lambda: interventions.p_true(lm, seqs, 4)),
        "knockout, 4D masks": ((no_pad, masked), lambda: run(lm, seqs, Resid(probes), 4, knockout)),
        "generation": (
            (no_pad, padded, step),
            lambda: generate_answers(lm, prompts, 2, 4, stop_at_newline=False, chat=True),
        ),
    }


def _decode_steps(lm, calls) -> int:
    """SDPA calls of one-token decoding steps: one query per row (or the query packed to the KV heads)."""
    text = lm.model.config.get_text_config()
    return sum(
        shapes[0][2] == 1 or backend.gqa_route(text, shapes) == "query packed to the KV heads"
        for _, shapes in calls
    )


@pytest.mark.parametrize("choice", ["auto", "math"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_each_pass_runs_the_kernel_the_load_log_names(arch, device, choice):
    lm = _twin(arch, device, choice)
    probed = backend.probe(lm.model, choice)
    assert list(probed) == list(backend.CASES)
    for case, (kernels, _) in probed.items():
        assert set(kernels.split("/")) <= EXPECTED[device, choice][case], (case, kernels)
    for path, (cases, call) in _passes(lm).items():
        with backend.profiled() as prof:
            call()
        calls = backend.sdpa_calls(prof)
        ran = {kernel for kernel, _ in calls}
        named = {kernel for case in cases for kernel in probed[case][0].split("/")}
        assert calls and ran <= named, (path, ran, probed)
        assert not backend.cudnn_attention(prof), path
        if "one-token decode step" in cases:
            assert _decode_steps(lm, calls) >= 3 * len(lm.model.model.layers), path  # 3 steps after the first


@pytest.mark.parametrize("device", DEVICES)
def test_saliency_runs_eager_attention_and_no_sdpa(device):
    """The saliency pass needs attention probabilities: eager attention (softmax of QK^T), no SDPA call; the
    model is back on SDPA after it."""
    lm = _twin("llama", device, "auto")
    seqs = _case()
    with backend.profiled() as prof:
        saliency.saliency(lm, seqs, [20, 14, 20, 22], [[11, 12]] * 4, [[22, 23]] * 4, 4)
    assert backend.sdpa_calls(prof) == [] and not backend.cudnn_attention(prof)
    assert any(e.name() == "aten::softmax" for e in backend._events(prof))
    assert lm.model.config._attn_implementation == "sdpa"


def test_cudnn_attention_is_found_in_the_op_and_kernel_names(monkeypatch):
    """The check can fail: a cuDNN SDPA op, or a device kernel of cuDNN's, is reported (profiler records made
    up here: no CPU runs cuDNN attention)."""

    class Event:
        def __init__(self, name, start, device=torch.autograd.DeviceType.CPU):
            self._name, self._start, self._device = name, start, device

        def name(self):
            return self._name

        def start_ns(self):
            return self._start

        def end_ns(self):
            return self._start + 1

        def shapes(self):
            return [[1, 4, 8, 64], [1, 4, 8, 64]]

        def device_type(self):
            return self._device

    kernel = "cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x64_4x1x1_kernel0_0"
    events = [
        Event("aten::scaled_dot_product_attention", 0),
        Event("aten::_scaled_dot_product_cudnn_attention", 1),
        Event(kernel, 2, torch.autograd.DeviceType.CUDA),
    ]
    monkeypatch.setattr(backend, "_events", lambda prof: events)
    assert backend.sdpa_calls(None) == [("cudnn", [[1, 4, 8, 64], [1, 4, 8, 64]])]
    assert backend.cudnn_attention(None) == ["sdpa call 0: cudnn", kernel]


def test_probe_names_how_grouped_query_heads_reach_the_kernel():
    """A twin with 4 query and 2 KV heads: transformers 5.19 hands SDPA the KV heads where no mask is given
    (GQA in the kernel) and repeats them under a mask, the one-token decode step's padding mask included
    (5.20 and later pack that step's query onto the KV heads instead)."""
    lm = _twin("llama", "cpu", "auto")
    routes = {case: gqa for case, (_, gqa) in backend.probe(lm.model, "auto").items()}
    assert routes == {
        "pass without padding": "GQA in the kernel",
        "padded batch": "keys repeated to every head",
        "pass with a 4D mask": "keys repeated to every head",
        "one-token decode step": "keys repeated to every head",
    }
    line = backend.describe(lm.model, "auto")
    assert "a one-token decode step runs flash (keys repeated to every head)" in line, line
