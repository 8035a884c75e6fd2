"""Attention saliency ("Two Pathways to Truthfulness", Fig. 1; METHOD A15 defines L, S^l and the two
means): how much the loss on the model's own answer (the answer ids after the prompt ids, from position s)
flows through attention edges leaving E_Q. An empty cell set gives NaN; duplicate positions count once.

dL/dA needs the probabilities in the autograd graph: the stage runs under `eager` attention
(`backend.gradient_mode`; `engine.attention_pass`). The batch loss is the SUM of per-sample mean losses, so
batched equals one at a time."""

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from ..engine import attention_pass, logits_at, logprob_stats, run_batched, store, unnormed
from ..engine.backend import gradient_mode
from ..engine.batches import shared_head
from ..engine.logits import final_norm, head_logits
from ..models import LoadedModel


# ------------------------------------------------------------------------------------------- reduction
def pair_masks(n: int, eq: Sequence[int], ea: Sequence[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The two cell sets of one sample as bool [width, width] masks (query i, key j), width >= n:
    (i in E_A, j in E_Q) and (j in E_Q, j < i < n)."""
    key_q, query_a = torch.zeros(width, dtype=torch.bool), torch.zeros(width, dtype=torch.bool)
    for name, pos, flags in (("E_Q", eq, key_q), ("E_A", ea, query_a)):
        bad = [p for p in pos if not 0 <= int(p) < n]
        if bad:
            raise ValueError(f"{name} positions {bad[:5]} are outside the sequence of {n} tokens")
        flags[torch.as_tensor(list(pos), dtype=torch.long)] = True
    idx = torch.arange(width)
    later = (idx[:, None] > idx[None, :]) & (idx[:, None] < n)
    return query_a[:, None] & key_q[None, :], later & key_q[None, :]


def pooled(s: torch.Tensor, to_answer: torch.Tensor, to_all: torch.Tensor) -> torch.Tensor:
    """S [..., T, T] -> [..., 2]: its means over the cell sets of `pair_masks` (NaN for an empty set)."""

    def mean(mask):
        count = mask.sum(dim=(-2, -1))
        total = (s * mask).sum(dim=(-2, -1))
        return torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, float("nan")))

    return torch.stack([mean(to_answer), mean(to_all)], dim=-1)


# ------------------------------------------------------------------------------------- loss and dL/dA
def answer_loss(model, hidden: torch.Tensor, ids: torch.Tensor, lengths, answer_start, offset: int):
    """Sum over rows of the mean NLL of the answer tokens; hidden [B, K, D] (final-normed) holds positions
    offset.. The LM head runs on the predicting positions only, in one call (its matmuls dominate)."""
    rows = [r for r, (n, s) in enumerate(zip(lengths, answer_start, strict=True)) for _ in range(s, n)]
    pos = [t - 1 - offset for n, s in zip(lengths, answer_start, strict=True) for t in range(s, n)]
    weight = [1.0 / (n - s) for n, s in zip(lengths, answer_start, strict=True) for _ in range(s, n)]
    device = hidden.device
    rows_t, pos_t = torch.tensor(rows, device=device), torch.tensor(pos, device=device)
    targets = ids.to(device)[rows_t, pos_t + 1 + offset]
    logits = head_logits(model, hidden[rows_t, pos_t])
    nll = -torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    return (nll * torch.tensor(weight, dtype=logits.dtype, device=device)).sum()


def attention_and_grads(
    lm: LoadedModel, seqs: list[list[int]], answer_start: list[int], head: int = 0, capture_at=None
):
    """One right-padded batch, inside `backend.gradient_mode`: (summed per-sample loss, [A^l [B, H, T - head,
    T]], [dL/dA^l], valid [B, T], the residual stream before the final norm [B, T - head, D], the states after
    every layer at capture_at (relative to the head) or None), all detached (`engine.attention_pass`)."""
    model = lm.model
    with unnormed(model):  # the residual stream, for the E_A log-probabilities (`saliency`)
        ids, valid, attns, resid, states = attention_pass(lm, seqs, head, capture_at)
    with torch.enable_grad():
        norm = final_norm(model)
        hidden = resid if norm is None else norm(resid)  # the model's own final norm, as its pass applies it
        loss = answer_loss(model, hidden, ids, [len(s) for s in seqs], answer_start, head)
        del hidden
        grads = list(torch.autograd.grad(loss, attns))
    return loss.detach(), [a.detach() for a in attns], grads, valid, resid.detach(), states


# ------------------------------------------------------------------------------------------------- stage
class Saliency(NamedTuple):
    scores: np.ndarray  # float32 [N, L, 2]: [..., 0] = S(E_Q->E_A), [..., 1] = S(E_Q->*), layers 1..L
    logit_mean: np.ndarray  # [N] Logits-mean / Logits-min of the E_A tokens (A17), from the same pass
    logit_min: np.ndarray


def saliency(
    lm: LoadedModel,
    seqs: list[list[int]],
    answer_start: list[int],
    eq_positions: list[list[int]],
    ea_positions: list[list[int]],
    batch_size: int,
    desc: str = "saliency",
    states: tuple[list[int], np.ndarray] | None = None,
) -> Saliency:
    """Attention saliency of every sample at every layer, and the E_A tokens' Logits-mean / Logits-min read
    off the same pass's residual stream (`engine.logits_at`). states = (positions, out [N, L, D]): that pass's
    residual stream after every layer at one position per sample (at or after its first E_Q token and
    answer_start - 1), written into out (the knockout's clean states)."""
    n, model = len(seqs), lm.model
    result = np.full((n, model.config.get_text_config().num_hidden_layers, 2), np.nan, dtype=np.float32)
    mean, low = np.full(n, np.nan), np.full(n, np.nan)
    for s, a, eq, ea in zip(seqs, answer_start, eq_positions, ea_positions, strict=True):  # same lengths
        if not 1 <= a < len(s):  # bad inputs fail before any model work
            raise ValueError(f"answer_start {a} must lie in [1, {len(s) - 1}] for {len(s)} tokens")
        pair_masks(len(s), eq, ea, len(s))
    states_at, out = states if states is not None else (None, None)
    if states_at is not None:
        cases = zip(states_at, seqs, answer_start, eq_positions, strict=True)
        bad = [i for i, (p, s, a, eq) in enumerate(cases) if not min([*eq, a - 1]) <= p < len(s)]
        if bad:
            raise ValueError(
                f"states positions of samples {bad[:5]} lie before E_Q and the answer, or past it"
            )

    def step(idx: list[int]) -> None:
        rows = [seqs[i] for i in idx]
        # the head every row shares (a chat header) before any cell read and any scored position runs once
        head = shared_head(rows, min(min([*eq_positions[i], answer_start[i] - 1]) for i in idx))
        capture_at = None if out is None else [states_at[i] - head for i in idx]
        _, attns, grads, valid, resid, states = attention_and_grads(
            lm, rows, [answer_start[i] for i in idx], head, capture_at
        )
        if states is not None:
            store(out, idx, states.numpy(), f"{desc}: resid_clean")
        # token p of E_A scored from position p - 1 (>= the head: E_A lies in the answer)
        at = [[p - 1 for p in ea_positions[i] if p >= 1] for i in idx]
        if any(at):
            with torch.no_grad():
                logits = logits_at(model, resid, at, head)
            targets = [[seqs[i][p + 1] for p in pos] for i, pos in zip(idx, at, strict=True)]
            mean[idx], low[idx] = logprob_stats(logits, targets)
        del resid
        masks = [pair_masks(len(seqs[i]), eq_positions[i], ea_positions[i], valid.shape[1]) for i in idx]
        to_answer, to_all = (torch.stack([m[k][head:] for m in masks]).to(valid.device) for k in (0, 1))
        per_layer = []
        for layer in range(len(attns)):
            s = (attns[layer].float() * grads[layer].float()).abs().sum(dim=1)  # [B, T - head, T]
            attns[layer] = grads[layer] = None  # free this layer as soon as it is reduced
            per_layer.append(pooled(s.to(valid.device), to_answer, to_all))
        result[idx] = torch.stack(per_layer, dim=1).cpu().numpy()

    with gradient_mode(model):
        run_batched(sorted(range(n), key=lambda i: -len(seqs[i])), batch_size, step, desc=desc)
    return Saliency(result, mean, low)
