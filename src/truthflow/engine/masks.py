"""Additive float 4D attention masks [B, 1, Tq, Tk] (0: may attend, finfo.min: may not). Boolean 4D masks are
silently wrong under eager attention in transformers 5.x. A 4D mask bypasses transformers' own masks, so each
layer type's sliding window is folded in here (`model_mask`)."""

import math

import torch

from ..errors import TruthflowError


def attention_mask(valid: torch.Tensor, block: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """valid, block: [B, T] bool (real tokens; tokens to knock out, or None) -> the causal padding mask [B, 1,
    T, T], 0 where query i may attend key j; an unblocked query attends no blocked key."""
    t = valid.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=valid.device).tril()  # [T(query), T(key)]
    allowed = causal[None] & valid[:, None, :]
    if block is not None:
        allowed = allowed & ~(block[:, None, :] & ~block[:, :, None])
    allowed = allowed | torch.eye(t, dtype=torch.bool, device=valid.device)[None]  # padding rows stay finite
    return torch.zeros_like(allowed, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


def reweight_mask(
    valid: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor, factor: float, dtype: torch.dtype
) -> torch.Tensor:
    """The causal padding mask plus log(factor) on every allowed cell with its query in `queries` and key in
    `keys` ([B, T] bool): it multiplies those attention weights by f, each row renormalized (METHOD A16)."""
    base = attention_mask(valid, None, dtype)
    if factor == 1.0:
        return base
    if factor <= 0:
        raise ValueError(f"reweighting factor must be > 0, got {factor}")
    edges = queries[:, :, None] & keys[:, None, :] & (base[:, 0] == 0)
    return base + edges[:, None].to(dtype) * math.log(factor)


def positions_tensor(rows: list[list[int]], lengths: list[int], shape, device) -> torch.Tensor:
    """[B, T] bool of the positions short of each row's length, built on the host, copied to `device` once."""
    cells = [(r, p) for r, (pos, n) in enumerate(zip(rows, lengths, strict=True)) for p in pos if p < n]
    t = torch.zeros(shape, dtype=torch.bool)
    t[[r for r, _ in cells], [p for _, p in cells]] = True  # one indexed write
    return t.to(device)


def layer_windows(config) -> list[int | None]:
    """Each decoder layer's sliding window in tokens (None: full attention), from the (text) config."""
    text = config.get_text_config()
    # Mistral has no layer_types: one window for every layer
    types = getattr(text, "layer_types", None) or ["sliding_attention"] * text.num_hidden_layers
    return [getattr(text, "sliding_window", None) if t == "sliding_attention" else None for t in types]


def fold_window(mask: torch.Tensor, window: int | None, q_start: int = 0) -> torch.Tensor:
    """mask [B, 1, Tq, Tk] (queries from q_start), key j blocked unless j > i - window (as transformers)."""
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
