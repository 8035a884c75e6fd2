"""Attention saliency: the reduction by hand, dL/dA against central finite differences of the loss with one
attention probability perturbed inside the forward (a tiny random Llama in float64 and the real SmolLM2 demo
model cast to float64), and batched == one at a time."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers
from transformers import AttentionInterface
from transformers.models.llama.modeling_llama import LlamaRMSNorm, repeat_kv

from truthflow.engine.backend import gradient_mode
from truthflow.engine.passes import attention_and_grads
from truthflow.models import LoadedModel
from truthflow.pathways.saliency import pair_masks, pooled, saliency

FD = "truthflow_test_fd"  # an attention function that perturbs one probability cell
_CELL: dict = {}  # layer -> (head, query, key, delta); row 0 of the batch only


def _fd_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Llama's eager attention written out, softmax in float64 for a float64 model (no float32 round trip,
    so a finite difference is not drowned in rounding), plus `delta` on A[0, head, query, key]."""
    k = repeat_kv(key, module.num_key_value_groups)
    v = repeat_kv(value, module.num_key_value_groups)
    scores = torch.matmul(query, k.transpose(2, 3)) * scaling
    if attention_mask is None:  # transformers passes no mask to a custom function on an unpadded batch
        t_q, t_k = scores.shape[-2:]
        future = torch.ones(t_q, t_k, dtype=torch.bool, device=scores.device).triu(t_k - t_q + 1)
        scores = scores.masked_fill(future, torch.finfo(scores.dtype).min)
    elif attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    else:
        scores = scores + attention_mask[..., : k.shape[-2]]
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(query.dtype, torch.float32))
    probs = probs.to(query.dtype)
    if module.layer_idx in _CELL:
        head, i, j, delta = _CELL[module.layer_idx]
        probs = probs.clone()
        probs[0, head, i, j] += delta
    return torch.matmul(probs, v).transpose(1, 2).contiguous(), probs


AttentionInterface.register(FD, _fd_attention)


def _rms_norm_keeping_dtype(self, hidden_states):
    """LlamaRMSNorm without its float32 round trip (float64 stays float64): transformers computes every
    norm in float32, whose rounding (~1e-7 of L) would swamp a finite difference of step 1e-5."""
    dtype = torch.promote_types(hidden_states.dtype, torch.float32)
    x = hidden_states.to(dtype)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return self.weight * x.to(hidden_states.dtype)


@pytest.fixture
def float64_norms(monkeypatch):
    monkeypatch.setattr(LlamaRMSNorm, "forward", _rms_norm_keeping_dtype)


def _answer_nll(model, seq: list[int], start: int) -> float:
    """The definition, written independently: mean NLL of seq[start:] teacher-forced."""
    ids = torch.tensor([seq])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0].double()
    logp = torch.log_softmax(logits[start - 1 : len(seq) - 1], dim=-1)
    return float(-logp.gather(-1, ids[0, start:, None]).mean())


def _code_grads(lm, seq: list[int], start: int) -> tuple[float, list[torch.Tensor], list[torch.Tensor]]:
    with gradient_mode(lm.model):
        loss, attns, grads, _, _ = attention_and_grads(lm, [seq], [start])
    return float(loss), attns, grads


def _fd_grad(model, seq, start, layer, head, i, j, eps) -> float:
    before = model.config._attn_implementation
    model.set_attn_implementation(FD)
    try:
        values = []
        for sign in () if eps == 0 else (1, -1):
            _CELL.clear()
            _CELL[layer] = (head, i, j, sign * eps)
            values.append(_answer_nll(model, seq, start))
        return _answer_nll(model, seq, start) if eps == 0 else (values[0] - values[1]) / (2 * eps)
    finally:
        _CELL.clear()
        model.set_attn_implementation(before)


def _check_cells(lm, seq, start, cells, eps) -> float:
    """Largest |code - FD| / |FD| over the cells (each cell's gradient must be clearly non-zero)."""
    loss, attns, grads = _code_grads(lm, seq, start)
    # the code's loss is the definition's, and the FD forward (unperturbed) is the model's forward
    assert _answer_nll(lm.model, seq, start) == pytest.approx(loss, rel=1e-6)
    assert _fd_grad(lm.model, seq, start, 0, 0, 0, 0, eps=0) == pytest.approx(loss, rel=1e-6)
    worst = 0.0
    for layer, head, i, j in cells:
        code = float(grads[layer][0, head, i, j])
        fd = _fd_grad(lm.model, seq, start, layer, head, i, j, eps)
        assert abs(fd) > 1e-6, f"cell {(layer, head, i, j)}: gradient too small to test"
        worst = max(worst, abs(code - fd) / abs(fd))
    # A returned by the code are the probabilities (rows sum to 1, causal)
    for a in attns:
        assert torch.allclose(a[0].sum(-1), torch.ones_like(a[0].sum(-1)))
        assert float(a[0].triu(1).abs().max()) == 0.0
    return worst


def _tiny(attn: str = "eager", seed: int = 0) -> LoadedModel:
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention: repeat_kv is part of what is differentiated
        intermediate_size=64,
        vocab_size=64,
        max_position_embeddings=128,
        attn_implementation=attn,
    )
    model = transformers.LlamaForCausalLM(cfg).to(torch.float64).eval()
    return LoadedModel(model=model, tokenizer=SimpleNamespace(pad_token_id=0), info={}, device="cpu")


def _seq(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(1, 64, n)]


# --------------------------------------------------------------------------------------------- 1. reduction
def _reduce(s, eq, ea, n=None):
    """S [L, T, T] (or [T, T]) of one sample with n <= T real positions -> [L, 2] (or [2])."""
    return pooled(s, *pair_masks(s.shape[-1] if n is None else n, eq, ea, s.shape[-1])).numpy()


def test_reduction_hand_case():
    t = 5
    s0 = torch.arange(t * t, dtype=torch.float32).reshape(t, t)  # S(i, j) = 5i + j, upper triangle too
    s1 = s0.T.clone()  # S(i, j) = 5j + i
    eq, ea = [1, 2], [3, 4]
    got = _reduce(torch.stack([s0, s1]), eq, ea)
    assert got.shape == (2, 2) and got.dtype == np.float32
    # layer 0, E_Q->E_A: cells (3,1)=16 (3,2)=17 (4,1)=21 (4,2)=22 -> 76/4
    # layer 0, E_Q->*: key 1: queries 2,3,4 -> 11,16,21; key 2: queries 3,4 -> 17,22 -> 87/5
    # layer 1 (transposed): (3,1)=8 (3,2)=13 (4,1)=9 (4,2)=14 -> 44/4; 7,8,9,13,14 -> 51/5
    np.testing.assert_allclose(got, [[19.0, 17.4], [11.0, 10.2]], rtol=1e-6)

    # padding: a width-7 matrix with n=5 real positions; huge values in the padding rows are never counted
    padded = torch.full((7, 7), 1e6)
    padded[:5, :5] = s0
    np.testing.assert_allclose(_reduce(padded, eq, ea, n=5), [19.0, 17.4], rtol=1e-6)
    # E_Q->* of key 0 only: queries 1..4 -> 5, 10, 15, 20 -> 12.5; duplicates count once; empty set -> NaN
    got = _reduce(s0, [0, 0], [])
    assert np.isnan(got[0]) and got[1] == pytest.approx(12.5)
    with pytest.raises(ValueError, match="outside"):
        _reduce(s0, [1], [5])


# ------------------------------------------------------------------------ 2. dL/dA vs finite differences
def test_gradient_matches_finite_differences_tiny_llama(float64_norms):
    lm = _tiny()
    seq, start = _seq(12, 1), 8
    cells = [
        (0, 0, 9, 2),
        (0, 3, 10, 0),
        (0, 1, 7, 7),
        (1, 2, 10, 3),
        (1, 0, 8, 5),
        (1, 3, 10, 10),
        (1, 1, 7, 1),
    ]
    worst = _check_cells(lm, seq, start, cells, eps=1e-5)
    assert worst < 1e-6, worst  # measured ~2e-8
    # cells the loss cannot see have dL/dA exactly 0 in the code and in the FD: the last query row (its
    # logits predict nothing) and, in the last layer, queries before start - 1 (their logits are not scored)
    _, _, grads = _code_grads(lm, seq, start)
    assert all(float(g[0, :, 11].abs().max()) == 0.0 for g in grads)
    assert float(grads[1][0, :, : start - 1].abs().max()) == 0.0
    assert _fd_grad(lm.model, seq, start, 1, 1, 5, 1, 1e-5) == 0.0


# ------------------------------------------------------------------------- 4. batched == one at a time
def _inputs():
    seqs = [_seq(14, 2), _seq(9, 3), _seq(11, 4)]
    starts = [10, 6, 7]
    eqs = [[2, 3, 4], [1], [0, 5]]
    eas = [[11, 12], [7], [8, 9, 10]]
    return seqs, starts, eqs, eas


def test_batched_equals_one_at_a_time_and_eager_switch():
    lm = _tiny(attn="sdpa")  # the stage switches to eager for the call and back after it
    seqs, starts, eqs, eas = _inputs()
    for p in list(lm.model.parameters())[:3]:
        p.requires_grad_(False)  # a partly frozen model: its flags come back as they were
    flags = [p.requires_grad for p in lm.model.parameters()]
    batched = saliency(lm, seqs, starts, eqs, eas, batch_size=3).scores
    assert batched.shape == (3, 2, 2) and batched.dtype == np.float32
    assert np.isfinite(batched).all() and (batched > 0).all()
    assert lm.model.config._attn_implementation == "sdpa"
    assert [p.requires_grad for p in lm.model.parameters()] == flags
    assert all(p.grad is None for p in lm.model.parameters())
    single = np.concatenate(
        [saliency(lm, [s], [a], [q], [e], batch_size=1).scores for s, a, q, e in zip(*_inputs(), strict=True)]
    )
    # float64 model, float32 output (and the model's eager softmax rounds to float32): equal to ~1e-7
    np.testing.assert_allclose(batched, single, rtol=1e-6)
    np.testing.assert_allclose(saliency(lm, seqs, starts, eqs, eas, batch_size=2).scores, single, rtol=1e-6)
    with pytest.raises(ValueError, match="answer_start"):
        saliency(lm, seqs, [10, 9, 7], eqs, eas, batch_size=3)  # start 9 = len: no answer token
    # the API output is the reduction of |A * dL/dA| summed over heads (the FD-checked gradient)
    _, attns, grads = _code_grads(lm, seqs[0], starts[0])
    s = torch.stack([(a[0] * g[0]).abs().sum(0) for a, g in zip(attns, grads, strict=True)])
    np.testing.assert_allclose(single[0], _reduce(s.float(), eqs[0], eas[0]), rtol=1e-6)
