"""The engine's one entry: `run(lm, seqs, readout, batch_size, conditions)` runs a pass (a condition and a
readout, `engine.readouts`) over samples, in length-sorted batches with the OOM back-off (`run_batched`),
under the attention kernels the model's setting allows, and puts the numbers where the readout says. Every
forward call it makes is in `passes`; no other module of truthflow runs a model."""

from collections.abc import Sequence

import numpy as np
import torch

from ..errors import TruthflowError
from . import backend, passes
from .batches import run_batched, shared_head
from .conditions import Condition
from .decoding import GREEDY
from .hooks import decoder_layers
from .readouts import AttnGrad, AttnGradBatch, Logits, Resid, Tokens


def length_order(lengths: Sequence[int], longest_first: bool = True) -> list[int]:
    """The order in which samples are batched: by length, so a batch pads little; longest first, so an
    out-of-memory back-off happens on the first batch, not after hours. Ties keep the input order."""
    return sorted(range(len(lengths)), key=lambda i: -lengths[i] if longest_first else lengths[i])


def run(lm, seqs: list[list[int]], readout, batch_size: int, conditions=None, desc: str = "pass"):
    """Run `readout` over every sample (token ids) of `seqs`: Resid under `conditions` (default: the clean
    pass) -> one array per condition; Logits -> per sample its reduced values; AttnGrad -> its `out`, with
    the reduced logits of its `logits` per sample (or None); Tokens -> per prompt the new token ids."""
    if conditions is not None and not isinstance(readout, Resid):
        raise ValueError(f"{type(readout).__name__} reads the clean pass only; conditions need a Resid")
    if isinstance(readout, Resid):
        conditions = [Condition()] if conditions is None else list(conditions)
        return _resid(lm, seqs, readout, conditions, batch_size, desc)
    if isinstance(readout, Logits):
        return _logits(lm, seqs, readout, batch_size, desc)
    if isinstance(readout, AttnGrad):
        return _attn_grad(lm, seqs, readout, batch_size, desc)
    if isinstance(readout, Tokens):
        return _tokens(lm, seqs, readout, batch_size, desc)
    raise TypeError(f"not a readout: {readout!r}")


def store(dst, idx, values: np.ndarray, what: str) -> None:
    """dst[idx] = values in dst's dtype. A value that is not finite there is refused with one line naming the
    stage: inf or NaN out of the model (the state files store the model's own dtype, which holds every value
    it computes), or a finite value past the range of a caller's narrower array."""
    with np.errstate(over="ignore", invalid="ignore"):  # refused below, with the stage's own line
        out = values.astype(dst.dtype)
    if not np.isfinite(out).all():
        finite = np.isfinite(values)
        if not finite.all():
            raise TruthflowError(
                f"{what}: the model computed {(~finite).sum():,} inf or NaN values in its residual stream "
                f"(its arithmetic overflowed; the model's dtype float32 has the widest range)"
            )
        peak = float(np.abs(values.astype(np.float32)).max())
        raise TruthflowError(
            f"{what}: a residual value of |x| = {peak:,.0f} is past the range of the {dst.dtype} array it is "
            f"written into"
        )
    dst[idx] = out


# ------------------------------------------------------------------------------ the residual stream
def _resid(lm, seqs, readout: Resid, conditions: list[Condition], batch_size: int, desc: str):
    at, layer = list(readout.at), readout.layer
    n_layers = len(decoder_layers(lm.model))
    hidden = lm.model.config.get_text_config().hidden_size
    if layer is not None and not 1 <= layer <= n_layers:
        raise ValueError(f"layer {layer} is not in 1..{n_layers}")
    shape = (len(seqs), n_layers, hidden) if layer is None else (len(seqs), hidden)
    out = readout.out
    out = [np.zeros(shape, dtype=np.float32) for _ in conditions] if out is None else list(out)
    if len(out) != len(conditions) or any(a.shape != shape for a in out):
        raise ValueError(f"out arrays must have shape {shape}, one per condition")
    if any(c.window is not None for c in conditions) and layer is not None:
        raise ValueError("a window condition reads every layer")
    cut = [list(s[: p + 1]) for s, p in zip(seqs, at, strict=True)]  # nothing after the probe is needed
    if any(len(c.tokens[i]) < len(r) for c in conditions if c.tokens is not None for i, r in enumerate(cut)):
        raise ValueError("a condition's tokens must keep every sample's length")

    def step(idx: list[int]) -> None:
        def keep(n: int, values: torch.Tensor) -> None:
            store(out[n], idx, values.numpy(), f"{desc}: {conditions[n].name or f'condition {n}'}")

        passes.condition_states(lm, cut, at, idx, conditions, layer, keep)

    with torch.inference_mode(), backend.attention(lm.attention):
        run_batched(length_order([len(c) for c in cut]), batch_size, step, desc=desc)
    return out


# ------------------------------------------------------------------------------ the final logits
def _split(values: torch.Tensor, counts: list[int], idx: list[int], into: list) -> None:
    """Hand each sample of idx its own slice of the last axis of `values` (one device-to-host copy)."""
    host = values.cpu().numpy()
    ends = np.cumsum(counts)
    for i, n, end in zip(idx, counts, ends, strict=True):
        into[i] = host[..., end - n : end]


def _logits(lm, seqs, readout: Logits, batch_size: int, desc: str) -> list:
    at = [list(p) for p in readout.at]
    if len(at) != len(seqs):
        raise ValueError(f"Logits.at has {len(at)} entries for {len(seqs)} samples")
    results: list = [None] * len(seqs)

    def step(idx: list[int]) -> None:
        if not any(at[i] for i in idx):
            return
        values = passes.clean_logits(lm, [seqs[i] for i in idx], [at[i] for i in idx], readout)
        _split(values, [len(at[i]) for i in idx], idx, results)

    with torch.inference_mode():
        run_batched(length_order([len(s) for s in seqs]), batch_size, step, desc=desc)
    return results


# ------------------------------------------------------------------------------ attention x gradient
def _layer_scores(attns: list, grads: list, device):
    """S^l = sum over heads of |A^l * dL/dA^l| [B, T - head, T], float32 on `device`, layer by layer; each
    layer's A and dL/dA are freed as soon as it is made."""
    for layer in range(len(attns)):
        s = (attns[layer].float() * grads[layer].float()).abs().sum(dim=1)
        attns[layer] = grads[layer] = None
        yield s.to(device)


def _attn_grad(lm, seqs, readout: AttnGrad, batch_size: int, desc: str):
    n = len(seqs)
    starts, firsts = list(readout.answer_start), list(readout.reads_from)
    if len(starts) != n or len(firsts) != n:
        raise ValueError(f"AttnGrad needs one answer_start and one reads_from per sample ({n} samples)")
    logits = readout.logits
    at = None if logits is None else [list(p) for p in logits.at]
    results: list | None = None if logits is None else [None] * n

    def step(idx: list[int]) -> None:
        rows = [seqs[i] for i in idx]
        head = shared_head(rows, min(firsts[i] for i in idx))
        _, attns, grads, valid, resid = passes.attention_and_grads(lm, rows, [starts[i] for i in idx], head)
        if at is not None and any(at[i] for i in idx):
            with torch.no_grad():
                values = passes.read_logits(lm.model, resid, rows, [at[i] for i in idx], head, logits)
            _split(values, [len(at[i]) for i in idx], idx, results)
        del resid
        batch = AttnGradBatch(
            idx, head, valid.shape[1], valid.device, _layer_scores(attns, grads, valid.device)
        )
        readout.out[idx] = readout.pool(batch).cpu().numpy()

    with backend.gradient_mode(lm.model):
        run_batched(length_order([len(s) for s in seqs]), batch_size, step, desc=desc)
    return readout.out, results


# ------------------------------------------------------------------------------ decoding
def _tokens(lm, encoded: list[list[int]], readout: Tokens, batch_size: int, desc: str) -> list[list[int]]:
    decoding, keys = readout.decoding, readout.keys
    if decoding.sampled and (keys is None or len(keys) != len(encoded)):
        raise ValueError("sampled decoding needs one key per prompt")
    stop_list = sorted(set(readout.stop_ids))
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else stop_list[0]
    settings = dict(
        GREEDY,
        max_new_tokens=readout.max_new_tokens,
        pad_token_id=pad,
        eos_token_id=stop_list,
        disable_compile=True,
    )
    results: list = [None] * len(encoded)

    def generate_tokens(idx: list[int]) -> None:
        row_keys = [keys[i] for i in idx] if keys is not None else [""] * len(idx)
        rows = [encoded[i] for i in idx]
        new = passes.generate_batch(lm, rows, settings, readout.max_new_tokens, decoding, row_keys)
        for i, answer in zip(idx, new, strict=True):
            results[i] = answer

    # shortest first, unlike the teacher-forced passes: the order the answers were made and checked in (a
    # batch's padding, so its float rounding, depends on which prompts share it)
    order = length_order([len(e) for e in encoded], longest_first=False)
    cost = [len(e) + readout.max_new_tokens for e in encoded]
    with torch.inference_mode(), backend.attention(lm.attention):
        run_batched(
            order, batch_size, generate_tokens, desc=desc, cost=cost, token_budget=readout.token_budget
        )
    return results
