"""The knockout mask cell by cell, and the one-pass trick's exactness on a real demo model in float32."""

import numpy as np
import pytest
import torch

from truthflow.pathways.knockout import knockout_mask, per_layer_reference, resid_sweep, window_layers

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


def _case(lm):
    prompt = lm.tokenizer("Q: What is the capital of France?\nA:")["input_ids"]
    answer = lm.tokenizer(" Paris", add_special_tokens=False)["input_ids"]
    seq = prompt + answer
    eq = [
        i
        for i, t in enumerate(seq)
        if "France" in lm.tokenizer.decode([t]) or "capital" in lm.tokenizer.decode([t])
    ]
    assert eq
    return seq, len(seq) - 1, eq


@pytest.mark.model
@pytest.mark.parametrize("model", ["smollm", "gemma"])
@pytest.mark.parametrize("mode", ["cumulative"])  # window mode: test_architectures (twins)
def test_one_pass_equals_per_layer_reference(model, mode, request):
    lm = request.getfixturevalue(model)
    seq, probe, eq = _case(lm)
    short = seq[:-2]  # a shorter second row exercises the padding folded into the mask
    clean, ko = resid_sweep(
        lm,
        [seq, short],
        [probe, len(short) - 1],
        [eq, eq],
        batch_size=2,
        mode=mode,
        window=9,
        out_dtype=np.float32,
    )
    ref_clean, ref_ko = per_layer_reference(lm, seq, probe, eq, mode=mode, window=9)
    n_layers = lm.info["n_layers"]
    assert ko.shape == (2, n_layers, lm.info["hidden_size"])
    for k in range(n_layers):
        scale = np.abs(ref_ko[k]).max()
        assert np.abs(ko[0, k] - ref_ko[k]).max() <= 1e-4 * scale, f"layer {k + 1}"
        assert np.abs(clean[0, k] - ref_clean[k]).max() <= 1e-4 * np.abs(ref_clean[k]).max()
    # the knockout really changes the state (else the test above proves nothing)
    change = [np.abs(ko[0, k] - clean[0, k]).max() / np.abs(clean[0, k]).max() for k in range(n_layers)]
    assert max(change) > 1e-2
    ref_short_clean, ref_short_ko = per_layer_reference(lm, short, len(short) - 1, eq, mode=mode, window=9)
    assert np.allclose(ko[1], ref_short_ko, rtol=0, atol=1e-4 * np.abs(ref_short_ko).max())


def test_shared_prefix_rule():
    from truthflow.pathways.knockout import shared_prefix

    # condition 0 blocks 12 and 5 (row 1 first at 5); condition 1 blocks 9 in row 0; row 1's last token is 20
    assert shared_prefix([[[12, 13], [5]], [[9], []]], [30, 21]) == 5
    assert shared_prefix([[[], []]], [30, 21]) == 20  # nothing blocked: everything before the probes
    assert shared_prefix([], [7]) == 6
