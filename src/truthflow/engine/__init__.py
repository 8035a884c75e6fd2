"""The forward-pass engine: every pass of a model in truthflow runs here (a test holds it so): batches,
masks, hooks, passes (`Condition`s run by `resid_states`), logits (float32), decoding, backend (kernels)."""

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
