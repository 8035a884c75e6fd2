"""MIN-K% (Shi et al., arXiv 2310.16789) and Min-K%++ (Zhang et al., arXiv 2404.02936) of raw text (B1)."""

import math
from collections.abc import Sequence
from functools import partial

import numpy as np
import polars as pl
import torch

from ..engine import float_logits, run_batched, unnormed
from ..engine.passes import resid_final
from ..errors import TruthflowError
from ..models import LoadedModel


def k_label(k: float) -> str:
    """`20` for 20.0, `12.5` for 12.5: the suffix of the mink_/minkpp_ columns."""
    return str(int(k)) if float(k).is_integer() else str(k)


def mink_column(k: float, plus_plus: bool = False) -> str:
    return f"{'minkpp' if plus_plus else 'mink'}_{k_label(k)}"


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
CHUNK_ELEMENTS = 2**25  # float32 logits per chunk of batch_token_statistics


def _moments(logits, targets):
    """(log p of each target, mu, sigma of log p over the vocabulary) of logits [n, V] predicting targets
    [n]. Works in place on `logits` (the caller's own float copy): two [n, V] temporaries besides it."""
    logp = logits.sub_(torch.logsumexp(logits, dim=-1, keepdim=True)).clamp_(min=LOGP_FLOOR)
    token_logp = logp.gather(-1, targets[:, None]).squeeze(-1)
    p = logp.exp()
    mu = (p * logp).sum(-1)
    # centred second moment: Σ p (log p − mu)² equals Σ p (log p)² − mu² without float32 cancellation
    sigma = logp.sub_(mu[:, None]).square_().mul_(p).sum(-1).clamp_min(0.0).sqrt()
    return token_logp, mu, sigma


def batch_token_statistics(logits, targets, lengths: list[int], logits_of=None, vocab: int | None = None):
    """Per text, (log p of each target, mu, sigma of log p over the vocabulary) at each of row r's first
    lengths[r] (real) positions of a right-padded batch: logits [B, T, V] (any dtype; float32 copies)
    predicting targets [B, T], or with logits_of (e.g. `float_logits`) what it turns into float32 logits
    (the residual stream [B, T, D], vocab wide), in chunks of CHUNK_ELEMENTS; one copy to the host."""
    v = vocab or logits.shape[-1]
    # [B, T], row-major: rows stay in order
    real = torch.arange(logits.shape[1])[None, :] < torch.tensor(lengths)[:, None]
    flat = logits[real.to(logits.device)]
    tgt = targets[real.to(targets.device)]
    per_chunk = max(1, CHUNK_ELEMENTS // v)
    parts = []
    for start in range(0, flat.shape[0], per_chunk):
        rows = flat[start : start + per_chunk]
        chunk = logits_of(rows) if logits_of is not None else rows.to(torch.float32, copy=True)
        parts.append(torch.stack(_moments(chunk, tgt[start : start + per_chunk].to(chunk.device))))
        del chunk
    host = torch.cat(parts, dim=1).double().cpu().numpy()  # [3, positions]: one copy
    ends = np.cumsum(lengths)
    return [tuple(host[:, e - n : e]) for n, e in zip(lengths, ends, strict=True)]


def score_texts(
    lm: LoadedModel, texts: Sequence[str], k_grid: Sequence[float], batch_size: int, desc: str = "min-k%"
) -> pl.DataFrame:
    """One teacher-forced pass per batch; per text, in input order, n_tokens (the scored tokens: all after
    the first) and MIN-K% and Min-K%++ for every k of the grid (mink_{k}, minkpp_{k})."""
    model = lm.model
    encoded = [encode_for_scoring(lm.tokenizer, t) for t in texts]
    for i, ids in enumerate(encoded):
        if len(ids) < 2:
            raise TruthflowError(f"MIN-K%: text #{i} ({texts[i][:60]!r}) has no token after the BOS to score")
    stats: list = [None] * len(texts)  # per text (log p, mu, sigma)
    vocab = model.get_output_embeddings().weight.shape[0]

    @torch.inference_mode()
    def step(idx: list[int]) -> None:
        with unnormed(model):  # the residual stream [B, T, D]; float32 logits (final norm, head) per chunk
            resid, ids = resid_final(lm, [encoded[i] for i in idx])
        lengths = [len(encoded[i]) - 1 for i in idx]
        per_text = batch_token_statistics(
            resid[:, :-1], ids[:, 1:], lengths, logits_of=partial(float_logits, model), vocab=vocab
        )
        for i, st in zip(idx, per_text, strict=True):
            stats[i] = st

    # longest first: an out-of-memory back-off happens on the first batch, not after hours
    order = sorted(range(len(texts)), key=lambda i: -len(encoded[i]))
    run_batched(order, batch_size, step, desc=desc, unit="text")
    columns = {"n_tokens": [len(st[0]) for st in stats]}
    columns |= {mink_column(k): [min_k_percent(st[0], k) for st in stats] for k in k_grid}
    columns |= {mink_column(k, plus_plus=True): [min_k_plus_plus(*st, k) for st in stats] for k in k_grid}
    return pl.DataFrame(columns, schema={c: pl.Int64 if c == "n_tokens" else pl.Float64 for c in columns})
