"""Length-sorted batching with out-of-memory back-off: a CUDA OOM halves the batch and retries it. Batches
hold at most `batch_size` items and, with a token budget, at most `token_budget` tokens (rows x the longest
row's cost). Only the batch that ran out of memory is split: every other batch is the one a run without the
OOM makes (bit-identical); the split rows differ by float rounding only (tested to 1e-5 on the twins)."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Sequence

from tqdm.auto import tqdm

# Tests force the back-off on the CPU path: batches larger than this many items raise an OOM error.
FAKE_OOM_ENV = "TRUTHFLOW_FAKE_OOM_ABOVE"
# below this many tokens shared by every row, a batch runs full passes (a cache's bookkeeping would cost more
# than it saves)
MIN_SHARED_PREFIX = 8


# messages of allocation failures that are not torch.cuda.OutOfMemoryError (cuBLAS workspace, a cuDNN
# plan): a smaller batch cures them as it cures an OOM
OOM_MESSAGES = ("out of memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed")


def _is_oom(exc: BaseException) -> bool:
    import torch

    text = str(exc).lower()
    return isinstance(exc, torch.cuda.OutOfMemoryError) or any(m in text for m in OOM_MESSAGES)


def _maybe_fake_oom(n: int) -> None:
    limit = os.environ.get(FAKE_OOM_ENV)
    if limit and n > int(limit):
        import torch

        raise torch.cuda.OutOfMemoryError(
            f"CUDA out of memory (injected by {FAKE_OOM_ENV}={limit}, batch {n})"
        )


def next_batch(
    order: Sequence[int], start: int, size: int, cost: Sequence[int] | None, token_budget: int | None
) -> list[int]:
    """The items of the batch starting at order[start]: up to `size` of them and, with a token budget, only as
    many as keep rows x max(cost) within it (always at least one)."""
    idx = [order[start]]
    widest = cost[order[start]] if cost is not None else 0
    for item in order[start + 1 : start + size]:
        if token_budget is not None and cost is not None:
            widest = max(widest, cost[item])
            if (len(idx) + 1) * widest > token_budget:
                break
        idx.append(item)
    return idx


def run_batched(
    order: Sequence[int],
    batch_size: int,
    fn: Callable[[list[int]], None],
    desc: str,
    unit: str = "sample",
    cost: Sequence[int] | None = None,
    token_budget: int | None = None,
) -> int:
    """Call fn on consecutive slices of `order`, backing off on OOM (module docstring); cost[i]: the tokens
    item i occupies (e.g. prompt + new tokens). Returns the smallest batch-size cap used."""
    import torch

    i = 0
    full = max(1, int(batch_size))
    full_budget = int(token_budget) if token_budget else None
    size, budget, smallest = full, full_budget, full
    split_end = 0  # items before order[split_end] run at the halved size; after them, the full size again
    with tqdm(total=len(order), desc=desc, unit=unit, mininterval=2.0) as bar:
        while i < len(order):
            if i >= split_end:
                size, budget = full, full_budget
            idx = next_batch(order, i, size, cost, budget)
            failed = False
            try:
                _maybe_fake_oom(len(idx))
                fn(idx)
            except Exception as exc:  # noqa: BLE001 - only OOM is retried, the rest re-raised
                if not _is_oom(exc) or len(idx) == 1:
                    raise
                failed = True
            if failed:  # past the except block: the exception, its traceback and the step's tensors are gone
                split_end = max(split_end, i + len(idx))
                size = max(1, len(idx) // 2)
                smallest = min(smallest, size)
                if budget is not None:
                    budget = max(1, budget // 2)
                if torch.cuda.is_available():
                    gc.collect()  # tensors held by reference cycles of the failed step
                    torch.cuda.empty_cache()
                bar.write(f"{desc}: out of memory, batch of {len(idx)} split into batches of {size}")
                continue
            i += len(idx)
            bar.update(len(idx))
    return smallest


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int, side: str = "right"):
    """Token-id lists -> (input_ids [B, T] long, real-token mask [B, T] bool). Right padding keeps each row's
    positions 0..n-1 (teacher-forced passes); left padding lines up the last tokens (generation)."""
    import torch

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
    if not rows:
        return 0
    first = rows[0]
    n = max(0, min(limit, *(len(r) for r in rows)))
    for t in range(n):
        if any(r[t] != first[t] for r in rows[1:]):
            return t
    return n
