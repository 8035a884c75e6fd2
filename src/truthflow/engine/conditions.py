"""How a teacher-forced pass differs from the clean one: a `Condition` is a value (keys knocked out, tokens
replaced, attention edges reweighted) that `engine.run` applies, never a flag or class in an experiment's
module. It also knows the first position it can change, so the tokens before it run once for every
condition of a batch (the prefix cache of `passes.condition_states`)."""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .masks import attention_mask, positions_tensor, reweight_mask

Positions = Sequence[Sequence[int]]


@dataclass(frozen=True)
class Condition:
    """One pass over the samples' tokens; nothing set is the clean pass. Per-sample fields hold one entry per
    sample. block: key positions no later query attends (the knockout), in every layer or only in the `window`
    layers centred on the layer read (METHOD A7's window mode). tokens: each sample's token ids with some
    replaced, the same length (patching). edges, factor: (query, key positions) per sample whose attention
    weights are scaled by factor before renormalization (Pathway Reweighting). name: for messages."""

    block: Positions | None = None
    window: int | None = None
    tokens: Positions | None = None
    edges: tuple[Positions, Positions] | None = None
    factor: float = 1.0
    name: str = ""

    def __post_init__(self):
        if self.window is not None and self.block is None:
            raise ValueError("a window condition needs the positions it blocks")
        if self.factor <= 0:
            raise ValueError(f"reweighting factor must be > 0, got {self.factor}")

    def first_change(self, i: int, clean: Sequence[int]) -> int:
        """The first position of sample i (clean tokens `clean`) whose state this condition can change."""
        n = len(clean)
        if self.block is not None and self.block[i]:
            n = min(n, min(self.block[i]))  # only queries after a blocked key see the block
        if self.tokens is not None:
            changed = [t for t, (x, y) in enumerate(zip(self.tokens[i], clean, strict=False)) if x != y]
            n = min([n, *changed])
        if self.edges is not None and self.factor != 1.0 and self.edges[1][i]:
            n = min([n, *(p for p in self.edges[0][i] if p < len(clean))])
        return n

    def mask(self, idx: list[int], lengths: list[int], valid: torch.Tensor, dtype) -> torch.Tensor:
        """The additive mask of a batch of samples idx (right-padded, `valid`) under this condition."""

        def cells(rows):
            return positions_tensor([rows[i] for i in idx], lengths, valid.shape, valid.device)

        if self.block is not None:
            return attention_mask(valid, cells(self.block), dtype)
        if self.edges is not None and self.factor != 1.0:
            return reweight_mask(valid, cells(self.edges[0]), cells(self.edges[1]), self.factor, dtype)
        return attention_mask(valid, None, dtype)


def first_change(conditions: Sequence[Condition], rows: list[int], seqs: list[list[int]]) -> int:
    """Tokens every condition shares with the clean pass in every row of a batch: before the first token any
    condition changes, and before each row's last token (its probe, which a pass must compute)."""
    return max(
        0, min(min([len(seqs[i]) - 1, *(c.first_change(i, seqs[i]) for c in conditions)]) for i in rows)
    )


def window_layers(k: int, window: int, n_layers: int) -> range:
    """0-based layers knocked out for a probe at 0-based layer k: the window centred on k, clipped; layers
    after k cannot change layer k's output, so they are left out."""
    return range(max(0, k - window // 2), min(n_layers - 1, k) + 1)
