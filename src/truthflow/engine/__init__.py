"""The forward-pass engine: every pass of a model in truthflow runs here (a test holds it so).

- `batches`: length-sorted batches by rows and tokens, the out-of-memory back-off, the shared-prefix rule.
- `masks`: additive 4D masks (knockout, reweighting) with each layer type's sliding window folded in.
- `hooks`: residual-stream capture at (layer, position), the early stop, per-layer masks.
- `passes`: `Condition`s (clean, knockout, patched, reweighted) run over samples by `resid_states`, with the
  shared-prefix KV cache; `attention_pass` (saliency). `logits`: float32 logits and log-probabilities.
- `decoding`: greedy or sampled decoding. `backend`: the attention kernels, eager attention for gradients."""

from .backend import describe as describe_attention
from .batches import FAKE_OOM_ENV, run_batched
from .decoding import Decoding, decode
from .logits import float_logits, logits_at, logprob_stats, next_token_logits, unnormed
from .passes import Condition, attention_pass, resid_states, store

__all__ = [
    "FAKE_OOM_ENV",
    "Condition",
    "Decoding",
    "attention_pass",
    "decode",
    "describe_attention",
    "float_logits",
    "logits_at",
    "logprob_stats",
    "next_token_logits",
    "resid_states",
    "run_batched",
    "store",
    "unnormed",
]
