"""Float32 logits of a bf16 model: norm, head, soft-cap in float32, so log-probs are not rounded to bf16."""

import math
from contextlib import ExitStack, contextmanager

import numpy as np
import torch
import torch.nn.functional as F

from .batches import shared_head
from .passes import resid_final

HEAD_CHUNK_ELEMENTS = 2**26  # weight elements converted to float32 at a time (256 MiB)


def final_norm(model):
    return getattr(getattr(model, model.base_model_prefix), "norm", None)


@contextmanager
def unnormed(model):
    """Within the block, the base model's last_hidden_state is the residual stream before the final norm."""
    with ExitStack() as undo:
        if (norm := final_norm(model)) is not None:
            undo.callback(norm.register_forward_hook(lambda _m, args, _out: args[0]).remove)
        yield


def float_logits(model, resid: torch.Tensor) -> torch.Tensor:
    """Logits [..., V] in float32 (float64 for a float64 model) of residual-stream rows [..., D] taken under
    `unnormed`, on the head's device: final norm, LM head, final soft-cap, as the model applies them."""
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
    if softcap := getattr(model.config.get_text_config(), "final_logit_softcapping", None):
        logits = logits.div_(softcap).tanh_().mul_(softcap)
    return logits


def head_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """Logits of final-normed hidden rows [..., D] through the model's own head in its dtype, then float32
    and the final soft-cap: for a loss differentiated through the model (a float32 head would be kept)."""
    logits = model.get_output_embeddings()(hidden)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    softcap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    return torch.tanh(logits / softcap) * softcap if softcap else logits


def logits_at(model, resid: torch.Tensor, at: list[list[int]], offset: int = 0) -> torch.Tensor:
    """Float32 logits after each position at[r] of row r of an `unnormed` stream [B, T, D] (from `offset`)."""
    row_of = torch.tensor([r for r, pos in enumerate(at) for _ in pos], device=resid.device)
    cols = torch.tensor([p - offset for pos in at for p in pos], device=resid.device)
    return float_logits(model, resid[row_of, cols])


def next_token_logits(lm, rows: list[list[int]], at: list[list[int]]) -> torch.Tensor:
    """`logits_at` of one clean right-padded pass over rows (the shared head run once)."""
    head = shared_head(rows, min(p for pos in at for p in pos))
    with unnormed(lm.model):
        resid, _ = resid_final(lm, rows, head)
    return logits_at(lm.model, resid, at, head)


def logprob_stats(logits: torch.Tensor, targets: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Mean and min log-probability of each row's targets, over consecutive rows of `logits`; NaN if none."""
    lp = torch.log_softmax(logits, dim=-1)
    flat = torch.tensor([t for ts in targets for t in ts], device=lp.device)
    vals = lp[torch.arange(len(flat), device=lp.device), flat].cpu().numpy()
    per_row = np.split(vals, np.cumsum([len(t) for t in targets])[:-1])
    return tuple(np.array([f(v) if len(v) else math.nan for v in per_row]) for f in (np.mean, np.min))
