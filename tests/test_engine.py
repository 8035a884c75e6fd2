"""The forward-pass engine's own rules: the knockout mask cell by cell, the window of layers, the
shared-prefix rule of every kind of condition, the attention kernel policy, and that no module outside the
engine runs a model (the exactness of the one-pass tricks: tests/test_architectures.py, on twins)."""

import ast
import warnings
from pathlib import Path

import pytest
import torch

from truthflow.engine import Condition, backend
from truthflow.engine.masks import attention_mask as knockout_mask
from truthflow.engine.passes import first_change, window_layers

MIN = torch.finfo(torch.float32).min


def test_mask_hand_case():
    # row 0: 5 real tokens, E_Q = {1, 2}; row 1: 3 real tokens + 2 padding, E_Q = {0}
    valid = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    block = torch.tensor([[0, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    mask = knockout_mask(valid, block, torch.float32)
    assert mask.shape == (2, 1, 5, 5) and mask.dtype == torch.float32
    allowed = (mask[:, 0] == 0).int().tolist()
    assert allowed[0] == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],  # E_Q -> E_Q stays open
        [1, 0, 0, 1, 0],  # later positions cannot see E_Q
        [1, 0, 0, 1, 1],
    ]
    assert allowed[1] == [
        [1, 0, 0, 0, 0],
        [0, 1, 0, 0, 0],
        [0, 1, 1, 0, 0],
        [0, 1, 1, 1, 0],  # padding query rows: real keys minus E_Q, plus themselves (finite softmax)
        [0, 1, 1, 0, 1],
    ]
    assert set(mask.unique().tolist()) == {0.0, MIN}


def test_window_layers():
    assert list(window_layers(0, 9, 30)) == [0]
    assert list(window_layers(10, 9, 30)) == [6, 7, 8, 9, 10]
    assert list(window_layers(29, 9, 30)) == [25, 26, 27, 28, 29]


def test_shared_prefix_rule():
    seqs = [list(range(100, 131)), list(range(200, 222))]  # 31 and 22 tokens: probes at 30 and 21
    # condition 0 blocks 12 and 5 (row 1 first at 5); condition 1 blocks 9 in row 0
    conds = [Condition(block=[[12, 13], [5]]), Condition(block=[[9], []])]
    assert first_change(conds, [0, 1], seqs) == 5
    assert first_change(conds, [0], seqs) == 9  # row 0 alone: its own first block
    assert first_change([Condition(block=[[], []])], [0, 1], seqs) == 21  # nothing blocked: up to the probes
    assert first_change([Condition()], [0, 1], seqs) == 21
    assert first_change([], [0], seqs) == 30


def test_shared_prefix_of_patched_tokens_and_reweighted_edges():
    seqs = [list(range(100, 131)), list(range(200, 222))]
    patched = [list(s) for s in seqs]
    patched[0][17] = 7  # row 0 changes at 17, row 1 nowhere
    assert first_change([Condition(tokens=patched)], [0, 1], seqs) == 17
    assert first_change([Condition(tokens=patched)], [1], seqs) == 21
    queries, keys = [[14, 15, 40], [19, 20]], [[3], [4]]  # 40: past row 0's end, ignored
    assert first_change([Condition(edges=(queries, keys), factor=2.0)], [0, 1], seqs) == 14
    assert first_change([Condition(edges=(queries, keys), factor=1.0)], [0, 1], seqs) == 21  # x1: no change
    assert first_change([Condition(edges=(queries, [[], []]), factor=2.0)], [0, 1], seqs) == 21  # no key
    both = [Condition(tokens=patched), Condition(edges=(queries, keys), factor=0.5)]
    assert first_change(both, [1], seqs) == 19


def test_condition_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="window condition needs"):
        Condition(window=3)
    with pytest.raises(ValueError, match="factor must be > 0"):
        Condition(edges=([[1]], [[0]]), factor=0.0)


# ---------------------------------------------------------------- attention kernels
def test_auto_never_allows_cudnn_attention_and_names_what_runs():
    from torch.nn.attention import SDPBackend

    assert SDPBackend.CUDNN_ATTENTION not in backend.kernels("auto")
    assert backend.kernels("cudnn")[0] == SDPBackend.CUDNN_ATTENTION
    assert backend.kernels("math") == [SDPBackend.MATH]
    from truthflow.twins import build_twin

    twin = build_twin("llama")
    line = backend.describe(twin.model, "auto")
    # on a CPU torch's flash kernel takes both; on a GPU a 4D mask rules flash out
    assert line.startswith("attention: sdpa, setting 'auto' (kernels flash > efficient > math)"), line
    assert "a pass with a 4D mask runs " in line and "cudnn" not in line.split("(kernels")[1]
    assert backend.kernel_that_runs(twin.model, "math", masked=True) == "math"
    with pytest.raises(Exception, match="not one of auto, cudnn, flash, efficient, math"):
        backend.kernels("fastest")


def test_kernel_choice_changes_the_kernel_that_runs():
    """The setting reaches SDPA: under `math` only the math kernel runs, under `flash` on a CPU flash runs
    for a pass without a mask (a setting that never reached SDPA would leave both at the default)."""
    from truthflow.twins import build_twin

    twin = build_twin("llama")
    assert backend.kernel_that_runs(twin.model, "math", masked=False) == "math"
    if not torch.cuda.is_available():
        assert backend.kernel_that_runs(twin.model, "flash", masked=False) == "flash"


# ---------------------------------------------------------------- nothing outside the engine runs a model
SRC = Path(__file__).resolve().parents[1] / "src" / "truthflow"
MODEL_NAMES = {"model", "base", "lm_model"}


def _model_calls(path: Path) -> list[str]:
    """Calls in a module that run a model: `.generate(`, `.forward(`, a call of a name or attribute
    `model`/`base`, or of `get_output_embeddings()` / `get_input_embeddings()` results."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in ("generate", "forward"):
            found.append(f"{path.name}:{node.lineno} .{f.attr}(")
        elif isinstance(f, ast.Name) and f.id in MODEL_NAMES:
            found.append(f"{path.name}:{node.lineno} {f.id}(")
        elif isinstance(f, ast.Attribute) and f.attr in MODEL_NAMES:
            found.append(f"{path.name}:{node.lineno} .{f.attr}(")
        elif (
            isinstance(f, ast.Call)
            and isinstance(f.func, ast.Attribute)
            and f.func.attr.endswith("_embeddings")
        ):
            found.append(f"{path.name}:{node.lineno} {f.func.attr}()(")
        elif isinstance(f, ast.Call) and isinstance(f.func, ast.Name) and f.func.id == "getattr":
            found.append(f"{path.name}:{node.lineno} getattr(...)(")
    return found


def test_no_module_outside_the_engine_calls_a_model():
    engine = SRC / "engine"
    outside = [p for p in SRC.rglob("*.py") if engine not in p.parents]
    calls = [c for p in outside for c in _model_calls(p)]
    assert calls == []
    inside = [c for p in engine.rglob("*.py") for c in _model_calls(p)]
    assert inside, "the walker finds the engine's own calls (it would pass vacuously otherwise)"


def test_every_stage_runs_its_model_from_the_engine():
    """At run time: a pre-hook on the model's decoder layers records which truthflow module called into
    torch for every pass of every stage on a twin; all of them are engine modules."""
    import inspect

    from truthflow.depth.mink import score_texts
    from truthflow.engine import resid_states
    from truthflow.generation import generate_answers
    from truthflow.pathways import interventions as iv
    from truthflow.pathways.saliency import saliency
    from truthflow.twins import build_twin

    twin = build_twin("llama")
    callers: set[str] = set()

    def hook(_mod, _args):
        for frame in inspect.stack()[1:]:
            name = frame.frame.f_globals.get("__name__", "")
            if name.startswith("truthflow."):
                callers.add(name)
                return

    handle = twin.model.model.layers[0].register_forward_pre_hook(hook)
    caught = warnings.catch_warnings(record=True)
    seen = caught.__enter__()
    warnings.simplefilter("always")
    try:
        seqs = [[1, *range(10, 30)], [1, *range(40, 55)]]
        probes = [len(s) - 1 for s in seqs]
        generate_answers(twin, ["Q: a\nA:", "Q: bb\nA:"], 2, 3, True, False)
        resid_states(twin, seqs, probes, [Condition(), Condition(block=[[3], [4]], window=3)], 2)
        resid_states(twin, seqs, probes, [Condition(tokens=seqs)], 2, layer=1)
        saliency(twin, seqs, [15, 10], [[3], [4]], [[18], [12]], 2)
        iv.p_true(twin, seqs, 2)
        iv.answer_logprobs(twin, seqs, [[18], [12]], 2)
        score_texts(twin, ["some text here", "more"], [20.0], 2)
    finally:
        caught.__exit__(None, None, None)
        handle.remove()
    assert callers and all(c.startswith("truthflow.engine.") for c in callers), callers
    # the current transformers API: no stage hands a cache over as `past_key_values`
    assert not [str(w.message) for w in seen if "past_key_values" in str(w.message)]


# ---------------------------------------------------------------- every kernel gives the same states
def _kernel_agreement(device: str, dtype: torch.dtype, rel: float) -> list[str]:
    """The knockout's clean and E_Q states under every kernel setting that runs here, against `math`, on a
    twin with a sliding window (gemma3) and one without (llama). Returns the settings compared."""
    import numpy as np
    from conftest import knockout_sweep

    from truthflow.twins import build_twin

    compared = []
    for arch in ("llama", "gemma3"):
        twin = build_twin(arch, dtype=dtype)
        twin.model.to(device)
        seqs = [[1, *range(20, 20 + n)] for n in (30, 24, 33, 27)]
        probes = [len(s) - 1 for s in seqs]
        blocks = [[[5, 6], [7], [4, 5, 6], [8]]]
        runs = {}
        for choice in backend.KERNELS:
            if backend.kernel_that_runs(twin.model, choice, masked=True) == "none":
                continue
            twin.attention = choice
            clean, kos = knockout_sweep(twin, seqs, probes, blocks, 2)
            runs[choice] = np.stack([clean, *kos])
        ref = runs.pop("math")
        scale = np.abs(ref).max()
        assert np.abs(ref[1] - ref[0]).max() > rel * scale  # the knockout changes the states
        for choice, got in runs.items():
            assert np.abs(got - ref).max() <= rel * scale, (arch, choice)
            compared.append(f"{arch}:{choice}")
    return compared


def test_knockout_states_agree_across_the_kernels_of_a_cpu():
    assert "llama:auto" in _kernel_agreement("cpu", torch.float32, 1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_knockout_states_agree_across_the_kernels_of_a_gpu():
    """Every kernel setting that runs on this GPU (auto: memory-efficient under the 4D mask; cudnn; efficient)
    against math, within bf16's rounding."""
    compared = _kernel_agreement("cuda", torch.bfloat16, 3e-2)
    assert any(c.endswith(":auto") for c in compared) and any(c.endswith(":efficient") for c in compared)
