"""The knockout mask cell by cell, the window of layers and the shared-prefix rule (the one-pass trick's
exactness: tests/test_architectures.py, on twins of four architectures)."""

import torch

from truthflow.pathways.knockout import knockout_mask, window_layers

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
    from truthflow.pathways.knockout import shared_prefix

    # condition 0 blocks 12 and 5 (row 1 first at 5); condition 1 blocks 9 in row 0; row 1's last token is 20
    assert shared_prefix([[[12, 13], [5]], [[9], []]], [30, 21]) == 5
    assert shared_prefix([[[], []]], [30, 21]) == 20  # nothing blocked: everything before the probes
    assert shared_prefix([], [7]) == 6
