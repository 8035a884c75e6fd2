"""The forward-pass engine: every pass of a model in truthflow runs here, below both papers' packages.

- `batches`: length-sorted batches by rows and tokens, the out-of-memory back-off, the shared-prefix rule.
- `masks`: additive 4D masks (knockout, reweighting) with each layer type's sliding window folded in.
- `hooks`: capture of the residual stream at (layer, position), the early stop, per-layer masks.
- `passes`: a `Condition` is a value (clean, knockout, window knockout, patched tokens, reweighted edges);
  `resid_states` runs conditions over samples with the shared-prefix KV cache; `attention_pass` (saliency).
- `logits`: float32 logits and log-probabilities where they are read.
- `decoding`: greedy or sampled decoding (`Decoding`), each sample's draws fixed by its key.
- `backend`: which attention kernel runs (`models.<name>.attention`), and eager attention for gradients.
Nothing outside this package calls a model's forward or `generate`; a test walks the sources to hold it so.
"""

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
