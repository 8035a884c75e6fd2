"""The forward-pass engine's own rules: the knockout mask cell by cell, the window of layers, the
shared-prefix rule of every kind of condition, the attention kernel policy, sampled decoding (that no module
but the entry runs a model: tests/test_engine_entry.py; the exactness of the one-pass tricks:
tests/test_architectures.py, on twins)."""

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


# ---------------------------------------------------------------- sampled decoding
def test_row_decoding_hand_case(monkeypatch):
    """Top-p keeps the most probable tokens while the mass before them is below p (0.5 and 0.3 of
    [0.5, 0.3, 0.15, 0.05] at p = 0.75); the token is the kept one with the largest p / q. q = [1, 0.5, ...]:
    0.5 against 0.6, token 1; q = [0.1, 1, ...]: token 0; tokens 2 and 3 never win, however small their q."""
    from truthflow.engine import decoding

    scores = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    ids = torch.tensor([[9]])  # a prompt of one token, no new one yet (step 0)
    picks = []
    for q in ([1.0, 0.5, 1e-3, 1e-3], [0.1, 1.0, 1e-3, 1e-3]):
        monkeypatch.setattr(decoding, "race_noise", lambda seed, key, step, n, device, q=q: torch.tensor(q))
        valid = torch.ones(1, 1, dtype=torch.bool)
        out = decoding.RowDecoding(decoding.Decoding(temperature=1.0, top_p=0.75), ["q1"], valid)(
            ids, scores.clone()
        )
        assert torch.isfinite(out).sum() == 1
        picks.append(int(out.argmax()))
    assert picks == [1, 0]


def test_repetition_penalty_hand_case():
    """Seen tokens' logits are divided by the penalty (multiplied where negative): [2, -1, 0.5] with tokens
    0 and 1 seen, penalty 2 -> [1, -2, 0.5]. Left padding (token 2 here) is not a seen token."""
    from truthflow.engine.decoding import Decoding, RowDecoding

    prompt_valid = torch.tensor([[False, True]])  # [pad=2, 0]
    ids = torch.tensor([[2, 0, 1]])  # then token 1 was generated
    proc = RowDecoding(Decoding(repetition_penalty=2.0), ["q"], prompt_valid)
    out = proc(ids, torch.tensor([[2.0, -1.0, 0.5]]))
    assert out.tolist() == [[1.0, -2.0, 0.5]]
    # padding with id 0 beside a real token 0, and padding with id 0 alone: only real tokens count
    same_id = proc(torch.tensor([[0, 0, 1]]), torch.tensor([[2.0, -1.0, 0.5]]))
    pad_only = proc(torch.tensor([[0, 2, 1]]), torch.tensor([[2.0, -1.0, 0.5]]))
    assert same_id.tolist() == [[1.0, -2.0, 0.5]] and pad_only.tolist() == [[2.0, -2.0, 0.25]]


def test_draws_depend_on_seed_key_and_step_only():
    from truthflow.engine.decoding import Decoding, race_noise

    def q(*args):
        return race_noise(*args, 5, "cpu")

    assert torch.equal(q(42, "q1", 3), q(42, "q1", 3)) and (q(0, "", 0) > 0).all()
    draws = [q(42, "q1", 3), q(43, "q1", 3), q(42, "q2", 3), q(42, "q1", 4)]
    assert all(not torch.equal(a, b) for i, a in enumerate(draws) for b in draws[i + 1 :])
    assert Decoding.from_config({}) == Decoding() and not Decoding().sampled
    cfg = {"mode": "sampled", "temperature": 1.0, "top_p": 0.9, "repetition_penalty": 1.03, "seed": 42}
    assert Decoding.from_config(cfg) == Decoding(1.0, 0.9, 1.03, 42)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_sampled_answers_do_not_depend_on_the_batch(arch):
    """Sampled answers in batches of 1, 7 and 32 (and after an OOM split) are identical: each row's draws
    depend on the seed and its key alone; another seed gives other answers (the draws are used)."""
    from truthflow.engine import FAKE_OOM_ENV
    from truthflow.engine.decoding import Decoding
    from truthflow.generation import generate_answers
    from truthflow.twins import build_twin

    twin = build_twin(arch)
    prompts = [f"Q: question number {i} about {'x' * (i % 5)}\nA:" for i in range(20)]
    keys = [f"q{i}" for i in range(20)]
    sampled = Decoding(temperature=1.0, top_p=0.9, repetition_penalty=1.03, seed=42)

    def run(batch, decoding=sampled):
        out = generate_answers(twin, prompts, batch, 8, False, False, decoding=decoding, keys=keys)
        return [o["answer_ids"] for o in out]

    one = run(1)
    assert run(7) == one and run(32) == one
    import os

    os.environ[FAKE_OOM_ENV] = "4"
    try:
        assert run(32) == one
    finally:
        del os.environ[FAKE_OOM_ENV]
    assert run(32, Decoding(temperature=1.0, top_p=0.9, seed=7)) != one
    assert run(32, Decoding()) != one  # greedy differs from sampled at temperature 1


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_the_prefix_cache_is_read_not_ignored(arch):
    """The engine hands its KV cache to the model as `past_key_values` (transformers 5.19; 5.20 renamed it
    `cache`, and a model's **kwargs would swallow a keyword of the other release, silently): positions after
    a cached head equal the full pass, and differ from the same positions run on an empty cache."""
    from transformers import DynamicCache

    from truthflow.engine.passes import clean_pass, head_cache, model_parts
    from truthflow.twins import build_twin

    lm = build_twin(arch)
    base, _, _ = model_parts(lm.model)
    ids = torch.arange(3, 15).repeat(2, 1)
    ids[1, 6:] += 30  # the rows share their first 6 tokens
    valid = torch.ones_like(ids, dtype=torch.bool)
    with torch.inference_mode():
        full = base(input_ids=ids, attention_mask=valid.long()).last_hidden_state
        cached = clean_pass(base, ids, valid, 6, head_cache(base, ids, 6)).last_hidden_state
        empty = clean_pass(base, ids, valid, 6, DynamicCache()).last_hidden_state
    torch.testing.assert_close(cached, full[:, 6:], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(empty, full[:, 6:], rtol=1e-2, atol=1e-3)
