"""Every forward call of a model in truthflow, one function per kind of batch: the teacher-forced passes
over right-padded batches (positions 0..n-1 stay each row's own) for the residual stream under conditions,
the final logits and attention x gradient, and the decoding of a left-padded batch. `engine.run` is their
one caller; tests/test_engine_entry.py walks src/ and finds no model call outside this module.

The tokens every condition shares with the clean pass run once per batch on a KV cache (`first_change`,
`head_cache`). Caches hold every position (`DynamicCache()`): a sliding-window cache keeps only the window,
which a full-width mask cannot address."""

import copy
from collections.abc import Callable, Sequence
from contextlib import suppress

import torch
import torch.nn.functional as F
from transformers import DynamicCache, LogitsProcessorList

from ..errors import TruthflowError
from . import backend
from .batches import pad_batch, shared_head, worth_sharing
from .conditions import Condition, first_change, window_layers
from .decoding import Decoding, RowDecoding
from .hooks import LayerMasks, ResidCapture, Stop, decoder_layers, final_norm, unnormed
from .masks import attention_mask, layer_windows, model_mask
from .readouts import Logits

HEAD_CHUNK_ELEMENTS = 2**26  # weight elements converted to float32 at a time (256 MiB)


def model_parts(model):
    """(base model, its input device, dtype) of a causal LM."""
    return getattr(model, model.base_model_prefix), model.get_input_embeddings().weight.device, model.dtype


def pad_id(lm) -> int:
    return lm.tokenizer.pad_token_id or 0


def batch_tensors(seqs: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    ids, valid = pad_batch(seqs, pad, side="right")
    return ids.to(device), valid.to(device)


# ------------------------------------------------------------------------------ passes over a batch
def run_from(base, ids: torch.Tensor, mask: torch.Tensor, cache=None, start: int = 0, end: int | None = None):
    """Positions start..end-1 of every row on top of `cache` (holding 0..start-1; extended), or one pass
    without a cache (None), with the additive mask's rows for those queries and its keys up to end."""
    end = ids.shape[1] if end is None else end
    return base(
        input_ids=ids[:, start:end],
        attention_mask=model_mask(base.config, mask[:, :, start:end, :end], start),
        past_key_values=cache,
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
    with cap.paused():
        cache = head_cache(base, ids, head) if head else DynamicCache()
        if prefix > head:
            with suppress(Stop):
                run_from(base, ids, attention_mask(valid, None, base.dtype), cache, head, prefix)
    return cache


def clean_pass(base, ids: torch.Tensor, valid: torch.Tensor, head: int, cache=None, **kwargs):
    """One clean pass over positions head.. of a right-padded batch with transformers' own padding mask (so
    SDPA may run flash attention), on the cache of the shared head (`head_cache`, made here where not given);
    kwargs go to the base model (inputs_embeds replaces the ids)."""
    if head:
        kwargs["past_key_values"] = head_cache(base, ids, head) if cache is None else cache
        kwargs["position_ids"] = torch.arange(head, ids.shape[1], device=ids.device).expand(len(ids), -1)
    if "inputs_embeds" not in kwargs:
        kwargs["input_ids"] = ids[:, head:]
    return base(attention_mask=valid.long(), use_cache=bool(head), **kwargs)


def condition_states(
    lm,
    cut: list[list[int]],
    at: list[int],
    idx: list[int],
    conditions: Sequence[Condition],
    layer: int | None,
    keep: Callable[[int, torch.Tensor], None],
) -> None:
    """The residual stream at at[i] of the samples idx (tokens `cut`, ending at the probe) under each
    condition n, handed to keep(n, values [B, L, D] or [B, D], float32 on the host) one condition at a time.
    The prefix no condition changes runs once, on a cache every condition's pass starts from."""
    base, device, dtype = model_parts(lm.model)
    layers = decoder_layers(lm.model)
    full = [c for c in conditions if c.window is None]
    pad = pad_id(lm)
    ids, valid = batch_tensors([cut[i] for i in idx], pad, device)
    lengths, probes = [len(cut[i]) for i in idx], [at[i] for i in idx]
    with ResidCapture(layers, stop_after=None if layer is None else layer - 1) as cap:
        prefix = worth_sharing(first_change(full, idx, cut)) if full else 0
        cache = prefix_cache(base, cap, ids, valid, prefix) if prefix else None
        clean = attention_mask(valid, None, dtype) if len(full) < len(conditions) else None
        for n, c in enumerate(conditions):
            mask = c.mask(idx, lengths, valid, dtype)
            if c.window is not None:  # one truncated pass per layer, from position 0
                cap.set_positions(probes)
                values = window_passes(base, layers, cap, ids, clean, mask, c.window)
            else:
                cap.set_positions([p - prefix for p in probes])
                rows = ids
                if c.tokens is not None:
                    rows = batch_tensors([c.tokens[i][: len(cut[i])] for i in idx], pad, device)[0]
                with suppress(Stop):
                    run_from(base, rows, mask, None if cache is None else copy.deepcopy(cache), prefix)
                values = cap.stacked() if layer is None else cap.resid_post[layer - 1].float().cpu()
            keep(n, values)


def window_passes(base, layers, cap: ResidCapture, ids, clean_mask, ko_mask, window: int) -> torch.Tensor:
    """The states after every layer k of a knockout in the `window` layers centred on k only (METHOD A7's
    window mode): one pass per k, stopped after layer k, each layer given its own mask."""
    n_layers = len(layers)
    values = []
    try:
        with LayerMasks(layers, layer_windows(base.config)) as per_layer:
            for k in range(n_layers):
                knocked = window_layers(k, window, n_layers)
                per_layer.masks = {j: (ko_mask if j in knocked else clean_mask) for j in range(n_layers)}
                cap.stop_after = k  # layers above k do not change layer k: stop the pass there
                with suppress(Stop):
                    run_from(base, ids, clean_mask)
                values.append(cap.resid_post[k].float())  # on the device: one copy to the host for all k
    finally:
        cap.stop_after = None
    return torch.stack([v.to(values[0].device) for v in values], dim=1).cpu()


# ------------------------------------------------------------------------------ the final logits
def soft_cap(model, logits: torch.Tensor) -> torch.Tensor:
    """The model's final logit soft-cap (Gemma's cap * tanh(logits / cap)), or the logits where it has none;
    out of place, so that a loss differentiates through it."""
    if cap := getattr(model.config.get_text_config(), "final_logit_softcapping", None):
        return torch.tanh(logits / cap) * cap
    return logits


def float_logits(model, resid: torch.Tensor) -> torch.Tensor:
    """Logits [..., V] in float32 (float64 for a float64 model) of residual-stream rows [..., D] taken under
    `unnormed`, on the head's device: final norm, LM head, final soft-cap, as the model applies them, so
    that a bf16 model's log-probs are not rounded to bf16."""
    dtype = torch.promote_types(resid.dtype, torch.float32)
    x = resid.to(dtype)
    if (norm := final_norm(model)) is not None:
        x = norm(x)  # the norms of these models compute in float32 and keep a float32 input's dtype
    head = model.get_output_embeddings()
    w, b = head.weight, head.bias
    x = x.to(w.device, dtype)
    # a head already in this dtype runs as one matmul; a bf16 head is converted a chunk of rows at a time
    step = w.shape[0] if w.dtype == dtype else max(1, HEAD_CHUNK_ELEMENTS // w.shape[1])
    parts = [
        F.linear(x, w[i : i + step].to(dtype), None if b is None else b[i : i + step].to(dtype))
        for i in range(0, w.shape[0], step)
    ]
    logits = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)  # one chunk: no [N, V] copy
    return soft_cap(model, logits)


def read_logits(model, resid: torch.Tensor, rows: list[list[int]], at: list[list[int]], head: int, readout):
    """`readout.reduce` of the float32 logits after each position at[r] of row r of an `unnormed` stream
    [B, T - head, D] (positions from `head`), a chunk of positions at a time: [..., positions in order]."""
    row_of = torch.tensor([r for r, pos in enumerate(at) for _ in pos], device=resid.device)
    cols = torch.tensor([p - head for pos in at for p in pos], device=resid.device)
    states = resid[row_of, cols]
    # the token each position predicts in a teacher-forced pass; -1 after a row's last token
    following = [r[p + 1] if p + 1 < len(r) else -1 for r, pos in zip(rows, at, strict=True) for p in pos]
    next_ids = torch.tensor(following)
    vocab = model.get_output_embeddings().weight.shape[0]
    per_call = len(states) if readout.chunk_elements is None else max(1, readout.chunk_elements // vocab)
    parts = []
    for start in range(0, len(states), per_call):
        logits = float_logits(model, states[start : start + per_call])
        parts.append(readout.reduce(logits, next_ids[start : start + per_call].to(logits.device)))
        del logits
    return torch.cat(parts, dim=-1)


def clean_logits(lm, rows: list[list[int]], at: list[list[int]], readout: Logits) -> torch.Tensor:
    """`read_logits` of one clean right-padded pass over rows; the head the rows share before the first
    position read runs once."""
    head = shared_head(rows, min(p for pos in at for p in pos))
    base, device, _ = model_parts(lm.model)
    ids, valid = batch_tensors(rows, pad_id(lm), device)
    with unnormed(lm.model), backend.attention(lm.attention):
        resid = clean_pass(base, ids, valid, head).last_hidden_state
    return read_logits(lm.model, resid, rows, at, head, readout)


# ------------------------------------------------------------------------------ attention x gradient
def answer_loss(model, hidden: torch.Tensor, ids: torch.Tensor, lengths, answer_start, offset: int):
    """Sum over rows of the mean NLL of the answer tokens (METHOD A15's L); hidden [B, K, D] (final-normed)
    holds positions offset.. The LM head runs on the predicting positions only, in one call (its matmuls
    dominate), in the model's dtype: a float32 copy of the head would be kept for the backward pass."""
    rows = [r for r, (n, s) in enumerate(zip(lengths, answer_start, strict=True)) for _ in range(s, n)]
    pos = [t - 1 - offset for n, s in zip(lengths, answer_start, strict=True) for t in range(s, n)]
    weight = [1.0 / (n - s) for n, s in zip(lengths, answer_start, strict=True) for _ in range(s, n)]
    device = hidden.device
    rows_t, pos_t = torch.tensor(rows, device=device), torch.tensor(pos, device=device)
    targets = ids.to(device)[rows_t, pos_t + 1 + offset]
    logits = model.get_output_embeddings()(hidden[rows_t, pos_t])
    logits = soft_cap(model, logits.to(torch.promote_types(logits.dtype, torch.float32)))
    nll = -torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    return (nll * torch.tensor(weight, dtype=logits.dtype, device=device)).sum()


def attention_and_grads(lm, seqs: list[list[int]], answer_start: list[int], head: int = 0):
    """One clean right-padded pass with the attention weights in the autograd graph, rooted at the (detached)
    input embeddings, inside `backend.gradient_mode`: (summed per-sample loss, [A^l [B, H, T - head, T]],
    [dL/dA^l], valid [B, T], the residual stream before the final norm [B, T - head, D]), all detached. The
    shared head runs once, without a graph: dL/dA at a later query flows back from later positions only."""
    model = lm.model
    base, device, _ = model_parts(model)
    ids, valid = batch_tensors(seqs, pad_id(lm), device)
    with torch.no_grad():
        cache = head_cache(base, ids, head) if head else None
    with unnormed(model), torch.enable_grad():
        embeds = model.get_input_embeddings()(ids[:, head:]).detach().requires_grad_(True)
        out = clean_pass(base, ids, valid, head, cache, inputs_embeds=embeds, output_attentions=True)
    attns, resid = list(out.attentions or ()), out.last_hidden_state
    n_layers = model.config.get_text_config().num_hidden_layers
    if len(attns) != n_layers or any(a is None for a in attns):
        raise TruthflowError(
            f"saliency: the model returned {len(attns)} attention maps for {n_layers} layers "
            f"(attention '{model.config._attn_implementation}' must be eager)"
        )
    with torch.enable_grad():
        norm = final_norm(model)
        hidden = resid if norm is None else norm(resid)  # the model's own final norm, as its pass applies it
        loss = answer_loss(model, hidden, ids, [len(s) for s in seqs], answer_start, head)
        del hidden
        grads = list(torch.autograd.grad(loss, attns))
    return loss.detach(), [a.detach() for a in attns], grads, valid, resid.detach()


# ------------------------------------------------------------------------------ decoding
def generate_batch(
    lm, rows: list[list[int]], settings: dict, max_new_tokens: int, decoding: Decoding, keys: list[str]
) -> list[list[int]]:
    """New token ids of each row of one batch (`settings`: generate's arguments). Each row's rest is
    left-padded after the head the rows share (positions and attention mask are the row's own), prefilled
    once; a sliding window counts that padding too: with a window the answers could reach past, no head."""
    model = lm.model
    base, device, _ = model_parts(model)
    window = min(filter(None, layer_windows(model.config)), default=float("inf"))  # the narrowest window
    fits = max(map(len, rows)) + max_new_tokens <= window
    head = shared_head(rows, min(len(r) for r in rows) - 1) if fits else 0
    rest, valid = pad_batch([r[head:] for r in rows], settings["pad_token_id"], side="left")
    input_ids = torch.cat([torch.tensor([rows[0][:head]] * len(rows), dtype=rest.dtype), rest], 1)
    valid = torch.cat([torch.ones(len(rows), head, dtype=torch.bool), valid], 1)
    # overrides a model default ("static", "hybrid": it refuses a given cache) as a generate argument:
    # transformers warns on, and will refuse, a copied generation_config mixed with generate arguments
    kwargs = dict(settings, cache_implementation="dynamic")
    if head:
        cache = DynamicCache(config=model.config)
        base(input_ids=input_ids[:1, :head].to(device), past_key_values=cache, use_cache=True)
        cache.batch_repeat_interleave(len(rows))
        kwargs.update(past_key_values=cache, cache_implementation=None)
    if decoding.sampled or decoding.repetition_penalty != 1.0:
        kwargs["logits_processor"] = LogitsProcessorList([RowDecoding(decoding, keys, valid)])
    out = model.generate(input_ids=input_ids.to(device), attention_mask=valid.long().to(device), **kwargs)
    return out[:, input_ids.shape[1] :].tolist()
