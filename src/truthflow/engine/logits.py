"""Float32 logits of a bf16 (or fp16) model: the final norm, the LM head and Gemma's final soft-cap run in
float32 on the last residual stream, so log-probabilities are not rounded to the model's dtype first (bf16
keeps 8 significant bits: a logit of 20 lands on a grid of 0.125). Used where log-probabilities are the
result (MIN-K%, Logits-mean/min, P(True)); the saliency loss keeps the model's own head (its float32 copy
would be held for the backward pass), within the bound tests/test_gpu_paths.py states."""

from __future__ import annotations

from contextlib import contextmanager

import torch

HEAD_CHUNK_ELEMENTS = 2**26  # weight elements converted to float32 at a time (256 MiB)


def final_norm(model):
    return getattr(getattr(model, model.base_model_prefix), "norm", None)


@contextmanager
def unnormed(model):
    """Within the block, the base model's last_hidden_state is the residual stream before the final norm."""
    norm = final_norm(model)
    handle = None if norm is None else norm.register_forward_hook(lambda _m, args, _out: args[0])
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()


def float_logits(model, resid: torch.Tensor) -> torch.Tensor:
    """Logits [..., V] in float32 (float64 for a float64 model) of residual-stream rows [..., D] taken under
    `unnormed`, on the head's device: final norm, LM head, final soft-cap, as the model applies them."""
    dtype = torch.promote_types(resid.dtype, torch.float32)
    norm = final_norm(model)
    x = resid.to(dtype)
    if norm is not None:
        x = norm(x)  # the norms of these models compute in float32 and keep a float32 input's dtype
    head = model.get_output_embeddings()
    w, b = head.weight, head.bias
    x = x.to(w.device, dtype)
    # a head already in this dtype runs as one matmul; a bf16 head is converted a chunk of rows at a time
    step = w.shape[0] if w.dtype == dtype else max(1, HEAD_CHUNK_ELEMENTS // w.shape[1])
    parts = [
        torch.nn.functional.linear(
            x, w[i : i + step].to(dtype), None if b is None else b[i : i + step].to(dtype)
        )
        for i in range(0, w.shape[0], step)
    ]
    logits = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)  # one chunk: no [N, V] copy
    softcap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    if softcap:
        logits = logits.div_(softcap).tanh_().mul_(softcap)
    return logits
