"""What a pass reads, as values handed to `engine.run` beside the samples (a pass is a condition and a
readout). Four kinds: the residual stream at (layer, position) (`Resid`), the final float32 logits after
positions (`Logits`), attention x gradient (`AttnGrad`) and generated tokens (`Tokens`). A readout names
positions and where its numbers go; how a batch is padded, cached, masked and run is the engine's."""

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from .conditions import Positions
from .decoding import Decoding


@dataclass(frozen=True, eq=False)
class Resid:
    """The residual stream at position at[i] of each sample: after every decoder layer ([N, L, D] per
    condition) or after the 1-based `layer` only ([N, D]; the passes stop there). out: one array per
    condition to write into (e.g. memory-mapped .npy files, `pathways.activations`), else float32 arrays are
    made."""

    at: Sequence[int]
    layer: int | None = None
    out: Sequence[np.ndarray] | None = None


@dataclass(frozen=True, eq=False)
class Logits:
    """The float32 logits of the token after each position at[i] of a clean pass (final norm, LM head and
    soft-cap as the model applies them), handed to `reduce` with the ids that follow those positions (-1
    past a row's end): reduce(logits [n, V], next_ids [n]) -> [..., n], one value per position; each
    sample gets its own [..., len(at[i])] slice. The logits, not log-probs: P(True) compares two sets of
    logits, MIN-K% normalises them itself. chunk_elements: at most this many logits per `reduce` call (the
    rows of a long text), else a batch's positions in one call. A sample without positions gets None."""

    at: Positions
    reduce: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    chunk_elements: int | None = None


class AttnGradBatch(NamedTuple):
    """One batch of an `AttnGrad` pass, as `AttnGrad.pool` gets it."""

    rows: list[int]  # the samples of the batch
    head: int  # leading tokens the batch shares, run once without a graph: queries start there
    width: int  # the padded length T
    device: torch.device  # where the scores are
    scores: Iterator[torch.Tensor]  # per layer S^l [B, T - head, T], each freed once the next is made


@dataclass(frozen=True, eq=False)
class AttnGrad:
    """Attention x gradient of one clean pass under eager attention: per layer S^l = sum over heads of
    |A^l * dL/dA^l|, L the sum over samples of the mean NLL of the sample's tokens from answer_start[i] on
    (batched equals one at a time). pool(batch) -> [B, L, ...] reduces a batch's S^l to rows of out.
    reads_from[i]: sample i's first position whose query `pool` reads; the shared head stops before it.
    logits: a `Logits` read off the same pass. No residual states: a state read off this eager pass with
    gradients would hold another kernel's rounding than the `Resid` passes it is compared with."""

    answer_start: Sequence[int]
    reads_from: Sequence[int]
    pool: Callable[[AttnGradBatch], torch.Tensor]
    out: np.ndarray
    logits: Logits | None = None


@dataclass(frozen=True, eq=False)
class Tokens:
    """New token ids of each prompt, greedy or sampled (`Decoding`), up to max_new_tokens or any of
    stop_ids. keys: one sampling key per prompt (a question id) for sampled decoding. token_budget: at most
    this many tokens (rows x (longest prompt + max_new_tokens)) per batch."""

    max_new_tokens: int
    stop_ids: Sequence[int]
    decoding: Decoding = field(default_factory=Decoding)
    keys: Sequence[str] | None = None
    token_budget: int | None = None
