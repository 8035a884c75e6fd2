"""Attention saliency ("Two Pathways to Truthfulness", Fig. 1; METHOD A15 defines L, S^l and the two
means): how much the loss on the model's own answer (the answer ids after the prompt ids, from position s)
flows through attention edges leaving E_Q. An empty cell set gives NaN; duplicate positions count once.

The engine's `AttnGrad` readout runs the pass (eager attention, the loss L, dL/dA) and hands each batch's
S^l = sum over heads |A^l * dL/dA^l| to `pool`, which reduces it to the two means here."""

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from ..engine import AttnGrad, AttnGradBatch, Logits, run
from ..models import LoadedModel
from .interventions import logit_baselines, target_logprobs


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
) -> Saliency:
    """Attention saliency of every sample at every layer, and the E_A tokens' Logits-mean / Logits-min read
    off the same pass's residual stream. The knockout's clean states do not come from this eager pass with
    gradients but from the engine's pass beside the knockouts (`extract.knockout_states`)."""
    n = len(seqs)
    result = np.full((n, lm.model.config.get_text_config().num_hidden_layers, 2), np.nan, dtype=np.float32)
    for s, a, eq, ea in zip(seqs, answer_start, eq_positions, ea_positions, strict=True):  # same lengths
        if not 1 <= a < len(s):  # bad inputs fail before any model work
            raise ValueError(f"answer_start {a} must lie in [1, {len(s) - 1}] for {len(s)} tokens")
        pair_masks(len(s), eq, ea, len(s))

    def pool(batch: AttnGradBatch) -> torch.Tensor:
        masks = [pair_masks(len(seqs[i]), eq_positions[i], ea_positions[i], batch.width) for i in batch.rows]
        # the cells of the queries the pass computed: from the shared head on
        head, device = batch.head, batch.device
        to_answer, to_all = (torch.stack([m[k][head:] for m in masks]).to(device) for k in (0, 1))
        return torch.stack([pooled(s, to_answer, to_all) for s in batch.scores], dim=1)

    # token p of E_A scored from position p - 1 (>= the shared head: E_A lies in the answer)
    logits = Logits([[p - 1 for p in ea if p >= 1] for ea in ea_positions], target_logprobs)
    readout = AttnGrad(
        answer_start,
        # the shared head (a chat header) stops before any cell read and any scored position
        [min([*eq, a - 1]) for eq, a in zip(eq_positions, answer_start, strict=True)],
        pool,
        result,
        logits,
    )
    _, scored = run(lm, seqs, readout, batch_size, desc=desc)
    mean, low = logit_baselines(scored)
    return Saliency(result, mean, low)
