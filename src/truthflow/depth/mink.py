"""MIN-K% (Shi et al., arXiv 2310.16789) and Min-K%++ (Zhang et al., arXiv 2404.02936) of raw text (B1)."""

import math
from collections.abc import Sequence

import numpy as np
import polars as pl
import torch

from ..engine import Logits, run
from ..errors import TruthflowError
from ..models import LoadedModel
from .tables import mink_column


def n_lowest(n: int, k: float) -> int:
    if not 0 < k <= 100:
        raise TruthflowError(f"MIN-K% k={k} must be a percentage in (0, 100]")
    # rounding first keeps float noise (10 * 30 / 100 = 3.0000000000000004) from adding a token
    return max(1, math.ceil(round(k * n / 100, 9)))


def _lowest_mean(values: np.ndarray, k: float) -> float:
    values = np.asarray(values, dtype=np.float64).ravel()
    if values.size == 0:
        raise TruthflowError("MIN-K% of a text with no scored token (nothing after the BOS)")
    return float(np.sort(values)[: n_lowest(values.size, k)].mean())


def min_k_percent(token_logprobs: np.ndarray, k: float) -> float:
    """−mean of the lowest ⌈k%·n⌉ token log-probs: positive, higher = less likely seen in training."""
    return -_lowest_mean(token_logprobs, k)


def min_k_plus_plus(token_logprobs: np.ndarray, mu: np.ndarray, sigma: np.ndarray, k: float) -> float:
    """Mean of the lowest ⌈k%·n⌉ z = (log p − mu) / sigma, not negated (higher = more likely seen)."""
    logp, mu, sigma = (np.asarray(x, dtype=np.float64) for x in (token_logprobs, mu, sigma))
    # a one-hot next-token distribution has sigma 0; its token is then exactly as expected (z = 0)
    return _lowest_mean(np.where(sigma > 0, (logp - mu) / np.where(sigma > 0, sigma, 1.0), 0.0), k)


def encode_for_scoring(tokenizer, text: str) -> list[int]:
    """Raw text with the BOS in front (no chat template): the first token is context, never scored."""
    ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    bos = getattr(tokenizer, "bos_token_id", None)
    return ids if bos is None or ids[:1] == [bos] else [bos, *ids]


# the floor of a log-probability in the moments: a masked token (-inf) gets p = 0 and a finite log p, so
# p · log p and p · (log p − mu)² are 0, not NaN, without a masking pass (1e18² stays finite in float32)
LOGP_FLOOR = -1e18
CHUNK_ELEMENTS = 2**25  # float32 logits per `token_moments` call


def token_moments(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[3, n]: log p of each target, and mu, sigma of log p over the vocabulary, of float32 logits [n, V]
    predicting targets [n] (an `engine.Logits` reduce). Works in place on `logits` (the engine's own copy):
    two [n, V] temporaries besides it."""
    logp = logits.sub_(torch.logsumexp(logits, dim=-1, keepdim=True)).clamp_(min=LOGP_FLOOR)
    token_logp = logp.gather(-1, targets[:, None]).squeeze(-1)
    p = logp.exp()
    mu = (p * logp).sum(-1)
    # centred second moment: Σ p (log p − mu)² equals Σ p (log p)² − mu² without float32 cancellation
    sigma = logp.sub_(mu[:, None]).square_().mul_(p).sum(-1).clamp_min(0.0).sqrt()
    return torch.stack((token_logp, mu, sigma))


def score_texts(
    lm: LoadedModel, texts: Sequence[str], k_grid: Sequence[float], batch_size: int, desc: str = "min-k%"
) -> pl.DataFrame:
    """One teacher-forced pass per batch; per text, in input order, n_tokens (the scored tokens: all after
    the first) and MIN-K% and Min-K%++ for every k of the grid (mink_{k}, minkpp_{k})."""
    encoded = [encode_for_scoring(lm.tokenizer, t) for t in texts]
    for i, ids in enumerate(encoded):
        if len(ids) < 2:
            raise TruthflowError(f"MIN-K%: text #{i} ({texts[i][:60]!r}) has no token after the BOS to score")
    # every position but the last predicts the next token; a long text's logits a chunk at a time
    scored = Logits([range(len(ids) - 1) for ids in encoded], token_moments, chunk_elements=CHUNK_ELEMENTS)
    stats = [tuple(m.astype(np.float64)) for m in run(lm, encoded, scored, batch_size, desc=desc)]
    columns = {"n_tokens": [len(st[0]) for st in stats]}
    columns |= {mink_column(k): [min_k_percent(st[0], k) for st in stats] for k in k_grid}
    columns |= {mink_column(k, plus_plus=True): [min_k_plus_plus(*st, k) for st in stats] for k in k_grid}
    return pl.DataFrame(columns, schema={c: pl.Int64 if c == "n_tokens" else pl.Float64 for c in columns})
