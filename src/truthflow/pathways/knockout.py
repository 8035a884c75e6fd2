"""Attention knockout (METHOD A7: one pass with the block in every layer gives every layer's cumulative
knockout) and the residual stream at the probe position. The block is an additive float 4D mask; boolean
4D masks are silently wrong under eager attention in transformers 5.x. A 4D mask bypasses transformers' own
masks: `model_mask` folds each layer type's sliding window in, and caches hold every position
(`DynamicCache()`; a sliding-window cache keeps only the window, which a full-width mask cannot address).
The tokens every pass of a batch shares run once per batch (`condition_passes`).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence

import numpy as np
import torch
from transformers import DynamicCache

from ..batching import MIN_SHARED_PREFIX, common_head, pad_batch, run_batched
from ..errors import TruthflowError
from ..models import LoadedModel


def knockout_mask(valid: torch.Tensor, block: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """valid, block: [B, T] bool (real tokens; tokens to knock out, None: none). Returns the additive mask
    [B, 1, T, T] whose cell (b, i, j) is 0 when query i may attend key j, else finfo(dtype).min."""
    _, t = valid.shape
    idx = torch.arange(t, device=valid.device)
    causal = idx[None, :] <= idx[:, None]  # [T(query), T(key)]
    allowed = causal[None] & valid[:, None, :]
    if block is not None:
        later = idx[:, None] > idx[None, :]
        allowed = allowed & ~(block[:, None, :] & ~block[:, :, None] & later[None])
    allowed = allowed | torch.eye(t, dtype=torch.bool, device=valid.device)[None]  # padding rows stay finite
    mask = torch.zeros(allowed.shape, dtype=dtype, device=valid.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


def layer_windows(config) -> list[int | None]:
    """Each decoder layer's sliding window in tokens (None: full attention), from the (text) config."""
    text = config.get_text_config()
    window = getattr(text, "sliding_window", None)
    types = getattr(text, "layer_types", None)
    if types is None:  # Mistral: one window for every layer
        return [window] * text.num_hidden_layers
    return [window if t == "sliding_attention" else None for t in types]


def fold_window(mask: torch.Tensor, window: int | None, q_start: int = 0) -> torch.Tensor:
    """mask [B, 1, Tq, Tk] (queries at positions q_start.., keys at 0..) with keys `window` or more tokens
    behind the query blocked, as transformers' sliding-window mask does (key j visible iff j > i - window)."""
    if window is None:
        return mask
    tq, tk = mask.shape[-2:]
    i = torch.arange(q_start, q_start + tq, device=mask.device)[:, None]
    far = i - torch.arange(tk, device=mask.device)[None, :] >= window
    return mask.masked_fill(far, torch.finfo(mask.dtype).min)


def model_mask(config, mask: torch.Tensor, q_start: int = 0):
    """The attention_mask to give the base model for an additive 4D mask: each layer type's sliding window
    folded in; one tensor when every layer has the same window, else {layer type: mask} (hybrid models).
    Flash attention is refused: it reads a mask as padding only, so a knockout would silently do nothing."""
    impl = str(getattr(config, "_attn_implementation", None) or "")
    if "flash" in impl:
        raise TruthflowError(
            f"attention '{impl}' cannot apply the additive 4D mask of the knockout and the interventions "
            f"(it reads a mask as padding only): load the model with attn_implementation='sdpa' or 'eager'"
        )
    windows = layer_windows(config)
    if len(set(windows)) == 1:
        return fold_window(mask, windows[0], q_start)
    types = config.get_text_config().layer_types
    return {t: fold_window(mask, w, q_start) for t, w in dict(zip(types, windows, strict=True)).items()}


def decoder_layers(model) -> Sequence[torch.nn.Module]:
    return getattr(model, model.base_model_prefix).layers


def model_parts(lm: LoadedModel):
    """(base model, its input device, dtype, pad id) of a loaded model."""
    model, pad = lm.model, lm.tokenizer.pad_token_id
    device = model.get_input_embeddings().weight.device
    return getattr(model, model.base_model_prefix), device, model.dtype, 0 if pad is None else pad


class _Stop(Exception):
    pass


class ResidCapture:
    """Forward hooks that keep the residual stream after each decoder layer at one position per row, on the
    device: `stacked()` copies them to the host once per pass (a per-layer `.cpu()` syncs every layer)."""

    def __init__(self, layers: Sequence[torch.nn.Module], stop_after: int | None = None):
        self.layers = layers
        self.positions: torch.Tensor | None = None
        self._rows: torch.Tensor | None = None
        self.resid_post: list[torch.Tensor | None] = [None] * len(layers)
        self.stop_after = stop_after
        self.active = True
        self.handles = [layer.register_forward_hook(self._hook(i)) for i, layer in enumerate(layers)]

    def _hook(self, i: int):
        def hook(_mod, _args, output):
            if self.active:
                hidden = (output[0] if isinstance(output, tuple) else output).detach()  # [B, T, D]
                if self._rows is None or self._rows.device != hidden.device:
                    self._rows = torch.arange(hidden.shape[0], device=hidden.device)
                    self.positions = self.positions.to(hidden.device)
                self.resid_post[i] = hidden[self._rows, self.positions]  # [B, D], on the device
            if self.stop_after is not None and i == self.stop_after:
                raise _Stop  # a pass stopped at layer K (the shared prefix's too: no cache above K is read)

        return hook

    def set_positions(self, positions: list[int]) -> None:
        self.positions = torch.tensor(positions)
        self._rows = None

    def stacked(self) -> torch.Tensor:  # [B, L, D] float32 on the host: one device-to-host copy
        rows = [r for r in self.resid_post if r is not None]
        dev = rows[0].device
        return torch.stack([r.to(dev) for r in rows], dim=1).float().cpu()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class LayerMasks:
    """Pre-hooks that give chosen decoder layers their own attention mask (per-layer knockout)."""

    def __init__(self, layers: Sequence[torch.nn.Module], windows: Sequence[int | None]):
        self.masks: dict[int, torch.Tensor] = {}
        self.windows = windows
        self.handles = [
            layer.register_forward_pre_hook(self._hook(i), with_kwargs=True) for i, layer in enumerate(layers)
        ]

    def _hook(self, i: int):
        def hook(_mod, args, kwargs):
            if i in self.masks:
                kwargs["attention_mask"] = fold_window(self.masks[i], self.windows[i])
            return args, kwargs

        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _batch_tensors(seqs: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    ids, valid = pad_batch(seqs, pad_id, side="right")  # right padding: positions 0..n-1 stay the model's own
    return ids.to(device), valid.to(device)


def positions_tensor(rows: list[list[int]], lengths: list[int], shape, device) -> torch.Tensor:
    """[B, T] bool of the given positions, built on the host and copied to the device once; those at or past
    a row's length (after its probe) are dropped."""
    cells = [(r, p) for r, (pos, n) in enumerate(zip(rows, lengths, strict=True)) for p in pos if p < n]
    t = torch.zeros(shape, dtype=torch.bool)
    t[[r for r, _ in cells], [p for _, p in cells]] = True  # one indexed write
    return t.to(device)


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


@torch.inference_mode()
def resid_sweep_multi(
    lm: LoadedModel,
    seqs: list[list[int]],
    probe_pos: list[int],
    block_sets: list[list[list[int]]],
    batch_size: int,
    mode: str = "cumulative",
    window: int = 9,
    desc: str = "knockout",
    out_dtype=np.float16,
    out: tuple[np.ndarray | None, list[np.ndarray]] | None = None,
    clean_pass: bool = True,
) -> tuple[np.ndarray | None, list[np.ndarray]]:
    """Residual stream after every layer at probe_pos: clean, and under each knockout condition of
    `block_sets` (condition c blocks block_sets[c][i] in sample i; e.g. E_Q, then random-control draws);
    mode cumulative or window (METHOD A7; window: one truncated pass per k). Returns (resid_clean
    [N, L, D], [resid_ko [N, L, D] per condition]); `out` may pass memory-mapped arrays to stream into.
    clean_pass=False: no clean pass in cumulative mode (resid_clean None; the caller has the clean states from
    another pass of the same tokens, as `extract` from saliency's)."""
    base, device, dtype, pad_id = model_parts(lm)
    layers = base.layers
    shape = (len(seqs), len(layers), lm.model.config.get_text_config().hidden_size)
    keep_clean = clean_pass or mode == "window"  # window mode's clean pass is the mask its passes start from
    if out is None:
        kos = [np.zeros(shape, dtype=out_dtype) for _ in block_sets]
        clean = np.zeros(shape, dtype=out_dtype) if keep_clean else None
    else:
        clean, kos = out
        clean = clean if keep_clean else None
        arrays = [clean, *kos] if keep_clean else kos
        if len(kos) != len(block_sets) or any(a.shape != shape for a in arrays):
            raise ValueError(f"out arrays must have shape {shape}, one per condition")
    # probe position is the last token we need: drop everything after it
    seqs = [s[: p + 1] for s, p in zip(seqs, probe_pos, strict=True)]
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    names = ["resid_clean", *(f"knockout condition {c}" for c in range(len(block_sets)))]

    def step(idx: list[int]) -> None:
        ids, valid = _batch_tensors([seqs[i] for i in idx], pad_id, device)
        clean_mask = knockout_mask(valid, None, dtype)
        lengths = [len(seqs[i]) for i in idx]
        ko_masks = (
            knockout_mask(valid, positions_tensor([b[i] for i in idx], lengths, ids.shape, device), dtype)
            for b in block_sets
        )
        if mode == "window":
            masks, prefix = [clean_mask], 0
        else:
            masks = itertools.chain([clean_mask] if keep_clean else [], ko_masks)
            prefix = shared_prefix([[b[i] for i in idx] for b in block_sets], lengths)
            prefix = prefix if prefix >= MIN_SHARED_PREFIX else 0
        cap = ResidCapture(layers)
        try:
            probes = [probe_pos[i] for i in idx]
            passes = condition_passes(base, cap, ids, valid, probes, prefix, ((ids, m) for m in masks))
            dsts = list(zip([clean, *kos], names, strict=True))[0 if keep_clean else 1 :]
            for _, (dst, name) in zip(passes, dsts, strict=False):
                store(dst, idx, cap.stacked().numpy(), f"{desc}: {name}")
            if mode == "window":
                for dst, name, m in zip(kos, names[1:], ko_masks, strict=True):
                    values = _window_passes(base, layers, cap, ids, clean_mask, m, window)
                    store(dst, idx, values, f"{desc}: {name}")
        finally:
            cap.remove()

    run_batched(order, batch_size, step, desc=desc)
    return clean, kos


def shared_prefix(block_sets: list[list[list[int]]], lengths: list[int]) -> int:
    """Tokens every pass of a batch shares: those before any blocked position and every row's probe (the
    knockout mask differs from the clean one only in query rows after a blocked key)."""
    first = [min(b) for blocks in block_sets for b in blocks if b]
    return max(0, min([*first, *(n - 1 for n in lengths)]))


def condition_passes(base, cap: ResidCapture, ids, valid, probes: list[int], prefix: int, conditions):
    """Run each (ids, additive mask) of `conditions` on a right-padded batch, yielding after each pass with
    its states in `cap`; the first `prefix` tokens, the same in every pass, run once (nothing captured)."""
    cache = None
    if prefix:  # the head all rows share runs once (`head_cache`), the rest of the prefix per row
        head = common_head(ids[:, :prefix].tolist(), prefix)
        head = head if head >= MIN_SHARED_PREFIX else 0
        cap.active = False
        try:
            cache = head_cache(base, ids, head, base.dtype) if head else DynamicCache()
            if prefix > head:
                run_from(base, ids, knockout_mask(valid, None, base.dtype), cache, head, prefix)
        except _Stop:
            pass
        finally:
            cap.active = True
    cap.set_positions([p - prefix for p in probes])
    for c_ids, mask in conditions:
        try:
            run_from(base, c_ids, mask, None if cache is None else copy.deepcopy(cache), prefix)
        except _Stop:
            pass
        yield


def head_cache(base, ids: torch.Tensor, head: int, dtype):
    """Keys and values of the first `head` tokens, which every row of `ids` shares, computed for one row and
    repeated for the batch (equal to a batched pass up to float rounding: a matmul over 1 row vs B)."""
    one = ids[:1, :head]
    cache = DynamicCache()
    try:
        run_from(base, one, knockout_mask(torch.ones_like(one, dtype=torch.bool), None, dtype), cache, 0)
    except _Stop:  # passes that stop at layer K (`ResidCapture.stop_after`) read no cache above it
        pass
    cache.batch_repeat_interleave(ids.shape[0])
    return cache


def run_from(base, ids: torch.Tensor, mask: torch.Tensor, cache=None, start: int = 0, end: int | None = None):
    """Positions start..end-1 of every row on top of `cache` (holding 0..start-1; extended), or one pass
    without a cache (None), with the mask's rows for those queries and its keys up to end."""
    end = ids.shape[1] if end is None else end
    positions = torch.arange(start, end, device=ids.device)[None].expand(ids.shape[0], -1)
    return base(
        input_ids=ids[:, start:end],
        attention_mask=model_mask(base.config, mask[:, :, start:end, :end], start),
        past_key_values=cache,
        position_ids=positions,
        use_cache=cache is not None,
    )


def last_hidden_after_head(base, ids: torch.Tensor, valid: torch.Tensor, head: int, dtype) -> torch.Tensor:
    """The final hidden states of positions head..T-1 of a right-padded batch [B, T]: one clean pass, with
    the shared head run once (`head_cache`) when head > 0. Returns [B, T - head, D]."""
    cache = head_cache(base, ids, head, dtype) if head else None
    return run_from(base, ids, knockout_mask(valid, None, dtype), cache, head).last_hidden_state


def window_layers(k: int, window: int, n_layers: int) -> range:
    """0-based layers knocked out for a probe at 0-based layer k: the window centred on k, clipped;
    layers after k cannot change layer k's output, so they are left out."""
    half = window // 2
    return range(max(0, k - half), min(n_layers - 1, k + half, k) + 1)


def _window_passes(base, layers, cap: ResidCapture, ids, clean_mask, ko_mask, window: int) -> np.ndarray:
    n_layers = len(layers)
    out = []
    per_layer = LayerMasks(layers, layer_windows(base.config))
    try:
        for k in range(n_layers):
            per_layer.masks = {
                j: (ko_mask if j in window_layers(k, window, n_layers) else clean_mask)
                for j in range(n_layers)
            }
            cap.stop_after = k  # layers above k do not change layer k: stop the pass there
            try:
                run_from(base, ids, clean_mask)
            except _Stop:
                pass
            out.append(cap.resid_post[k].float())  # on the device: one copy to the host for all k
    finally:
        cap.stop_after = None
        per_layer.remove()
    dev = out[0].device
    return torch.stack([o.to(dev) for o in out], dim=1).cpu().numpy()
