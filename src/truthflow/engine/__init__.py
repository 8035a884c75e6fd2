"""The forward-pass engine: every pass of a model in truthflow is `run(lm, seqs, readout, batch_size,
conditions)`, a condition (`Condition`) and a readout (`Resid`, `Logits`, `AttnGrad`, `Tokens`); its forward
calls are all in `engine.passes` (tests/test_engine_entry.py holds it so). Callers import from here."""

from .backend import describe as describe_attention
from .batches import FAKE_OOM_ENV
from .conditions import Condition
from .decoding import Decoding
from .entry import run
from .readouts import AttnGrad, AttnGradBatch, Logits, Resid, Tokens

__all__ = [
    "FAKE_OOM_ENV",
    "AttnGrad",
    "AttnGradBatch",
    "Condition",
    "Decoding",
    "Logits",
    "Resid",
    "Tokens",
    "describe_attention",
    "run",
]
