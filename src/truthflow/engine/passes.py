"""Teacher-forced passes over right-padded batches (positions 0..n-1 stay each row's own).

A `Condition` says how a pass differs from the clean one (keys knocked out, tokens replaced, attention edges
reweighted); `resid_states` runs conditions over the same samples, keeping the residual stream at one position
per sample. The tokens every condition shares with the clean pass run once per batch on a KV cache
(`first_change`, `head_cache`). Caches hold every position (`DynamicCache()`): a sliding-window cache keeps
only the window, which a full-width mask cannot address."""

import copy
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from ..errors import TruthflowError
from . import backend
from .batches import pad_batch, run_batched, shared_head, worth_sharing
from .hooks import LayerMasks, ResidCapture, Stop, decoder_layers
from .masks import attention_mask, layer_windows, model_mask, positions_tensor, reweight_mask

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
            n = min([n, *(t for t, (x, y) in enumerate(zip(self.tokens[i], clean, strict=False)) if x != y)])
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


def model_parts(model):
    """(base model, its input device, dtype) of a causal LM."""
    return getattr(model, model.base_model_prefix), model.get_input_embeddings().weight.device, model.dtype


def pad_id(lm) -> int:
    return lm.tokenizer.pad_token_id or 0


def batch_tensors(seqs: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    ids, valid = pad_batch(seqs, pad, side="right")
    return ids.to(device), valid.to(device)


def run_from(base, ids: torch.Tensor, mask: torch.Tensor, cache=None, start: int = 0, end: int | None = None):
    """Positions start..end-1 of every row on top of `cache` (holding 0..start-1; extended), or one pass
    without a cache (None), with the additive mask's rows for those queries and its keys up to end."""
    end = ids.shape[1] if end is None else end
    return base(
        input_ids=ids[:, start:end],
        attention_mask=model_mask(base.config, mask[:, :, start:end, :end], start),
        cache=cache,
        position_ids=torch.arange(start, end, device=ids.device).expand(ids.shape[0], -1),
        use_cache=cache is not None,
    )


def head_cache(base, ids: torch.Tensor, head: int):
    """Keys and values of the first `head` tokens, which every row of `ids` shares, computed for one row and
    repeated for the batch (equal to a batched pass up to float rounding: a matmul over 1 row vs B)."""
    one = ids[:1, :head]
    cache = DynamicCache()
    with suppress(Stop):  # passes that stop at layer K read no cache above it
        run_from(base, one, attention_mask(torch.ones_like(one, dtype=torch.bool), None, base.dtype), cache)
    cache.batch_repeat_interleave(ids.shape[0])
    return cache


def prefix_cache(base, cap: ResidCapture, ids, valid, prefix: int):
    """The cache of the first `prefix` tokens of a batch: the head every row shares once, the rest per row;
    nothing captured."""
    head = shared_head(ids[:, :prefix].tolist(), prefix)
    cap.active = False
    try:
        cache = head_cache(base, ids, head) if head else DynamicCache()
        if prefix > head:
            with suppress(Stop):
                run_from(base, ids, attention_mask(valid, None, base.dtype), cache, head, prefix)
    finally:
        cap.active = True
    return cache


def clean_pass(base, ids: torch.Tensor, valid: torch.Tensor, head: int, cache=None, **kwargs):
    """One clean pass over positions head.. of a right-padded batch with transformers' own padding mask (so
    SDPA may run flash attention), on the cache of the shared head (`head_cache`, made here where not given);
    kwargs go to the base model (inputs_embeds replaces the ids)."""
    if head:
        kwargs["cache"] = head_cache(base, ids, head) if cache is None else cache
        kwargs["position_ids"] = torch.arange(head, ids.shape[1], device=ids.device).expand(len(ids), -1)
    if "inputs_embeds" not in kwargs:
        kwargs["input_ids"] = ids[:, head:]
    return base(attention_mask=valid.long(), use_cache=bool(head), **kwargs)


def resid_final(lm, rows: list[list[int]], head: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(the final residual stream [B, T - head, D] of positions head.., ids [B, T]) of one `clean_pass`; call
    under `logits.unnormed` for the stream before the final norm."""
    base, device, _ = model_parts(lm.model)
    ids, valid = batch_tensors(rows, pad_id(lm), device)
    with backend.attention(lm.attention):
        return clean_pass(base, ids, valid, head).last_hidden_state, ids


def store(dst: np.ndarray, idx, values: np.ndarray, what: str) -> None:
    """dst[idx] = values in dst's dtype; float16 storage refuses a value it would make inf (|x| > 65504)."""
    with np.errstate(over="ignore"):  # refused below, with the stage's own line
        out = values.astype(dst.dtype)
    if dst.dtype == np.float16 and np.isinf(out).any():
        peak = float(np.abs(values.astype(np.float32)).max())
        raise TruthflowError(
            f"{what}: a residual value of |x| = {peak:,.0f} overflows float16 storage (max 65,504; it would "
            f"be stored as inf); this model's residual stream needs float32 storage"
        )
    dst[idx] = out


def window_layers(k: int, window: int, n_layers: int) -> range:
    """0-based layers knocked out for a probe at 0-based layer k: the window centred on k, clipped; layers
    after k cannot change layer k's output, so they are left out."""
    return range(max(0, k - window // 2), min(n_layers - 1, k) + 1)


@torch.inference_mode()
def resid_states(
    lm,
    seqs: list[list[int]],
    at: list[int],
    conditions: Sequence[Condition],
    batch_size: int,
    layer: int | None = None,
    out: Sequence[np.ndarray] | None = None,
    desc: str = "pass",
) -> list[np.ndarray]:
    """The residual stream at position at[i] of each sample under each condition: after every decoder layer
    ([N, L, D] per condition), or after the 1-based `layer` only ([N, D]; the passes stop there). `out`: one
    array per condition to write into (e.g. memory-mapped .npy files), else float16 arrays are made."""
    model = lm.model
    base, device, dtype = model_parts(model)
    layers = decoder_layers(model)
    n_layers, hidden = len(layers), model.config.get_text_config().hidden_size
    if layer is not None and not 1 <= layer <= n_layers:
        raise ValueError(f"layer {layer} is not in 1..{n_layers}")
    shape = (len(seqs), n_layers, hidden) if layer is None else (len(seqs), hidden)
    out = [np.zeros(shape, dtype=np.float16) for _ in conditions] if out is None else out
    if len(out) != len(conditions) or any(a.shape != shape for a in out):
        raise ValueError(f"out arrays must have shape {shape}, one per condition")
    if any(c.window is not None for c in conditions) and layer is not None:
        raise ValueError("a window condition reads every layer")
    cut = [list(s[: p + 1]) for s, p in zip(seqs, at, strict=True)]  # nothing after the probe is needed
    if any(len(c.tokens[i]) < len(r) for c in conditions if c.tokens is not None for i, r in enumerate(cut)):
        raise ValueError("a condition's tokens must keep every sample's length")
    full = [c for c in conditions if c.window is None]
    pad = pad_id(lm)

    def step(idx: list[int]) -> None:
        ids, valid = batch_tensors([cut[i] for i in idx], pad, device)
        lengths, probes = [len(cut[i]) for i in idx], [at[i] for i in idx]
        cap = ResidCapture(layers, stop_after=None if layer is None else layer - 1)
        try:
            prefix = worth_sharing(first_change(full, idx, cut)) if full else 0
            cache = prefix_cache(base, cap, ids, valid, prefix) if prefix else None
            clean = attention_mask(valid, None, dtype) if len(full) < len(conditions) else None
            for n, c in enumerate(conditions):
                mask = c.mask(idx, lengths, valid, dtype)
                if c.window is not None:  # one truncated pass per layer, from position 0
                    cap.set_positions(probes)
                    values = _window_passes(base, layers, cap, ids, clean, mask, c.window)
                else:
                    cap.set_positions([p - prefix for p in probes])
                    rows = ids
                    if c.tokens is not None:
                        rows = batch_tensors([c.tokens[i][: len(cut[i])] for i in idx], pad, device)[0]
                    with suppress(Stop):
                        run_from(base, rows, mask, None if cache is None else copy.deepcopy(cache), prefix)
                    values = cap.stacked() if layer is None else cap.resid_post[layer - 1].float().cpu()
                store(out[n], idx, values.numpy(), f"{desc}: {c.name or f'condition {n}'}")
        finally:
            cap.remove()

    with backend.attention(lm.attention):
        run_batched(sorted(range(len(cut)), key=lambda i: -len(cut[i])), batch_size, step, desc=desc)
    return list(out)


def _window_passes(base, layers, cap: ResidCapture, ids, clean_mask, ko_mask, window: int) -> torch.Tensor:
    n_layers = len(layers)
    values = []
    per_layer = LayerMasks(layers, layer_windows(base.config))
    try:
        for k in range(n_layers):
            knocked = window_layers(k, window, n_layers)
            per_layer.masks = {j: (ko_mask if j in knocked else clean_mask) for j in range(n_layers)}
            cap.stop_after = k  # layers above k do not change layer k: stop the pass there
            with suppress(Stop):
                run_from(base, ids, clean_mask)
            values.append(cap.resid_post[k].float())  # on the device: one copy to the host for all k
    finally:
        cap.stop_after = None
        per_layer.remove()
    return torch.stack([v.to(values[0].device) for v in values], dim=1).cpu()


def attention_pass(lm, rows: list[list[int]], head: int, capture_at: list[int] | None):
    """One clean right-padded pass with the attention weights in the autograd graph, rooted at the (detached)
    input embeddings, under `backend.gradient_mode` and `logits.unnormed`: (ids, valid [B, T], [A^l [B, H,
    T - head, T]], the residual stream [B, T - head, D], the states after every layer at capture_at (relative
    to the head) [B, L, D] on the host or None). The shared head runs once, without a graph: dL/dA at a
    later query flows back from later positions only."""
    model = lm.model
    base, device, _ = model_parts(model)
    ids, valid = batch_tensors(rows, pad_id(lm), device)
    with torch.no_grad():
        cache = head_cache(base, ids, head) if head else None
    cap = ResidCapture(decoder_layers(model))  # captures nothing without positions
    try:
        if capture_at is not None:
            cap.set_positions(capture_at)
        with torch.enable_grad():
            embeds = model.get_input_embeddings()(ids[:, head:]).detach().requires_grad_(True)
            out = clean_pass(base, ids, valid, head, cache, inputs_embeds=embeds, output_attentions=True)
        states = None if capture_at is None else cap.stacked()
    finally:
        cap.remove()
    attns = list(out.attentions or ())
    n_layers = model.config.get_text_config().num_hidden_layers
    if len(attns) != n_layers or any(a is None for a in attns):
        raise TruthflowError(
            f"saliency: the model returned {len(attns)} attention maps for {n_layers} layers "
            f"(attention '{model.config._attn_implementation}' must be eager)"
        )
    return ids, valid, attns, out.last_hidden_state, states
