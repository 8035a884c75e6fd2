"""Length-sorted batching: batches of at most `batch_size` items and, with a token budget, `token_budget`
tokens (rows x the longest row's cost). A CUDA OOM halves the batch that ran out of memory and retries it
(its rows differ by float rounding only); every other batch is the one a run without the OOM makes."""

import gc
import itertools
import os
from collections.abc import Callable, Sequence

import torch
from tqdm.auto import tqdm

# Tests force the back-off on the CPU path: batches larger than this many items raise an OOM error.
FAKE_OOM_ENV = "TRUTHFLOW_FAKE_OOM_ABOVE"
# below this many tokens shared by every row, a batch runs full passes (a cache would cost more than it saves)
MIN_SHARED_PREFIX = 8
# other allocation failures (cuBLAS workspace, a cuDNN plan), which a smaller batch cures as it cures an OOM
OOM_MESSAGES = ("out of memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed")


def next_batch(
    order: Sequence[int], start: int, size: int, cost: Sequence[int] | None, token_budget: int | None
) -> list[int]:
    """Up to `size` items from order[start], and (at least one) as many as keep rows x max(cost) in budget."""
    idx = list(order[start : start + size])
    if token_budget is None or cost is None:
        return idx
    # rows x the widest row so far only grows along the batch: the rows within the budget are a prefix
    widest = itertools.accumulate((cost[i] for i in idx), max)
    return idx[: max(1, sum(n * w <= token_budget for n, w in enumerate(widest, 1)))]


def run_batched(
    order: Sequence[int],
    batch_size: int,
    fn: Callable[[list[int]], None],
    desc: str,
    unit: str = "sample",
    cost: Sequence[int] | None = None,
    token_budget: int | None = None,
) -> int:
    """Call fn on slices of `order` with the OOM back-off (cost[i]: item i's tokens); smallest cap used."""
    full = max(1, int(batch_size))
    full_budget = int(token_budget) if token_budget else None
    i, split_end, smallest = 0, 0, full  # items before order[split_end] run at the halved size
    with tqdm(total=len(order), desc=desc, unit=unit, mininterval=2.0) as bar:
        while i < len(order):
            if i >= split_end:
                size, budget = full, full_budget
            idx = next_batch(order, i, size, cost, budget)
            limit = os.environ.get(FAKE_OOM_ENV)
            try:
                if limit and len(idx) > int(limit):
                    raise torch.cuda.OutOfMemoryError(
                        f"CUDA out of memory (injected by {FAKE_OOM_ENV}={limit}, batch {len(idx)})"
                    )
                fn(idx)
            except Exception as exc:  # noqa: BLE001 - only OOM is retried, the rest re-raised
                text = str(exc).lower()
                oom = isinstance(exc, torch.cuda.OutOfMemoryError) or any(m in text for m in OOM_MESSAGES)
                if not oom or len(idx) == 1:
                    raise
            else:
                i += len(idx)
                bar.update(len(idx))
                continue
            # past the except block: the exception, its traceback and the step's tensors are gone
            split_end = max(split_end, i + len(idx))
            size = max(1, len(idx) // 2)
            smallest = min(smallest, size)
            if budget is not None:
                budget = max(1, budget // 2)
            if torch.cuda.is_available():
                gc.collect()  # tensors held by reference cycles of the failed step
                torch.cuda.empty_cache()
            bar.write(f"{desc}: out of memory, batch of {len(idx)} split into batches of {size}")
    return smallest


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int, side: str = "right"):
    """Token-id lists -> (input_ids, real-token mask) [B, T]; right-padded for passes, left for generation."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    valid = torch.zeros((len(seqs), width), dtype=torch.bool)
    for row, seq in enumerate(seqs):
        cols = slice(0, len(seq)) if side == "right" else slice(width - len(seq), width)
        ids[row, cols] = torch.tensor(list(seq), dtype=torch.long)
        valid[row, cols] = True
    return ids, valid


def worth_sharing(n: int) -> int:
    """n, or 0 below MIN_SHARED_PREFIX: the one rule for whether a batch runs a shared prefix once."""
    return n if n >= MIN_SHARED_PREFIX else 0


def shared_head(rows: Sequence[Sequence[int]], limit: int) -> int:
    """`common_head` of the rows, or 0 where it is too short to be worth a cache (`worth_sharing`)."""
    return worth_sharing(common_head(rows, limit)) if len(rows) > 1 else 0


def common_head(rows: Sequence[Sequence[int]], limit: int) -> int:
    """Leading tokens identical in every row (a chat template's header, the instruction), at most `limit`."""
    n = max(0, min([limit, *map(len, rows)])) if rows else 0
    return next((t for t in range(n) if any(r[t] != rows[0][t] for r in rows)), n)
