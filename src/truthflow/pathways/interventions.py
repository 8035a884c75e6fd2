"""The new forward passes of the Section 3.2-5 experiments (docs/method.md A12-A17) at one probe layer K,
each stopped there (layers above K cannot change it): token patching (E_Q ids replaced by a donor's), the
answer alone, Pathway Reweighting (attention on E_Q -> answer edges scaled), and the detection baselines
(P(True), answer-token log-probabilities)."""

from __future__ import annotations

import math
import random
import zlib

import numpy as np
import torch

from ..batching import MIN_SHARED_PREFIX, common_head, run_batched
from ..logits import float_logits, unnormed
from ..models import LoadedModel
from .knockout import (
    ResidCapture,
    _batch_tensors,
    condition_passes,
    decoder_layers,
    knockout_mask,
    last_hidden_after_head,
    model_parts,
    positions_tensor,
    store,
)


# ------------------------------------------------------------------ token patching (A12)
def _rng(seed: int, key: str) -> random.Random:
    return random.Random(f"{seed}:{zlib.crc32(key.encode())}")


def choose_donors(ids: list[str], eq_lengths: list[int], seed: int) -> list[tuple[int, bool]]:
    """Donor of each sample (METHOD A12): (donor index, length_matched) per sample; (-1, False) for a dataset
    of one sample."""
    by_len: dict[int, list[int]] = {}
    for i, n in enumerate(eq_lengths):
        by_len.setdefault(n, []).append(i)
    out = []
    for i, sid in enumerate(ids):
        rng = _rng(seed, sid)
        same = [j for j in by_len.get(eq_lengths[i], []) if j != i]
        if same:
            out.append((rng.choice(same), True))
            continue
        others = [j for j in range(len(ids)) if j != i]
        out.append((rng.choice(others), False) if others else (-1, False))
    return out


def donor_tokens(donor_eq_ids: list[int], n: int) -> list[int]:
    return [donor_eq_ids[k % len(donor_eq_ids)] for k in range(n)] if donor_eq_ids else []


def patch(seq: list[int], positions: list[int], tokens: list[int]) -> list[int]:
    out = list(seq)
    for p, t in zip(positions, tokens, strict=True):
        out[p] = t
    return out


def patched_inputs(
    ids: list[str],
    seqs: list[list[int]],
    eq_positions: list[list[int]],
    control_positions: list[list[int] | None],
    seed: int,
) -> dict:
    """The two patching conditions (METHOD A12): E_Q and the knockout's first control draw overwritten with
    the donor's E_Q ids; an unmatched sample's control input is the unpatched sequence (left out)."""
    eq_ids = [[s[p] for p in e] for s, e in zip(seqs, eq_positions, strict=True)]
    donors = choose_donors(ids, [len(e) for e in eq_positions], seed)
    target, control, donor_ids, matched = [], [], [], []
    for i, (j, same) in enumerate(donors):
        toks = donor_tokens(eq_ids[j], len(eq_positions[i])) if j >= 0 else []
        ok = j >= 0 and len(toks) == len(eq_positions[i])
        target.append(patch(seqs[i], eq_positions[i], toks) if ok else list(seqs[i]))
        ctrl = control_positions[i]
        control.append(patch(seqs[i], ctrl, toks) if ok and ctrl else list(seqs[i]))
        donor_ids.append(ids[j] if j >= 0 else "")
        matched.append(same)
    return {"target": target, "control": control, "donor": donor_ids, "length_matched": matched}


# ------------------------------------------------------------------ answer only (A13)
def answer_only_inputs(
    seqs: list[list[int]], prompt_lens: list[int], probe_pos: list[int], bos_id: int | None
) -> tuple[list[list[int]], list[int]]:
    """The answer without the question: [BOS] + the answer's token ids, the probe at the same answer token
    (its position shifted by the prompt's length, plus one for the BOS when the tokenizer has one)."""
    lead = [bos_id] if bos_id is not None else []
    out, pos = [], []
    for s, n, p in zip(seqs, prompt_lens, probe_pos, strict=True):
        if not n <= p < len(s):
            raise ValueError(f"probe position {p} is not in the answer (prompt {n} of {len(s)} tokens)")
        out.append(lead + list(s[n:]))
        pos.append(p - n + len(lead))
    return out, pos


# ------------------------------------------------------------------ Pathway Reweighting (A16)
def reweight_mask(
    valid: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor, factor: float, dtype: torch.dtype
) -> torch.Tensor:
    """The causal padding mask (as knockout_mask, nothing blocked) plus log(factor) on every allowed cell
    (i, j) with query i in `queries` and key j in `keys` ([B, T] bool each): before the softmax, it
    multiplies those attention weights by f and renormalizes each row (A16)."""
    base = knockout_mask(valid, None, dtype)  # [B, 1, T, T]
    if factor == 1.0:
        return base
    if factor <= 0:
        raise ValueError(f"reweighting factor must be > 0, got {factor}")
    edges = queries[:, :, None] & keys[:, None, :] & (base[:, 0] == 0)
    return base + edges[:, None].to(dtype) * math.log(factor)


def _first_change(
    base_rows: list[list[int]], conditions: list[dict], rows: list[int], lengths: list[int]
) -> int:
    """Tokens all conditions share with the clean sequences, in every row: before the first token a
    condition changes, the first query whose attention it reweights, and each row's last token (its probe)."""
    first = [n - 1 for n in lengths]
    for c in conditions:
        for r, i in enumerate(rows):
            if c["seqs"] is not None:
                diff = [t for t, (x, y) in enumerate(zip(c["seqs"][i], base_rows[i], strict=True)) if x != y]
                if diff:
                    first[r] = min(first[r], diff[0])
            if c["edges"] is not None and c["factor"] != 1.0:
                q = [p for p in c["edges"][0][i] if p < lengths[r]]
                if q and c["edges"][1][i]:
                    first[r] = min(first[r], min(q))
    return max(0, min(first))


@torch.inference_mode()
def resid_conditions(
    lm: LoadedModel,
    seqs: list[list[int]],
    probe_pos: list[int],
    layer: int,
    conditions: list[dict],
    batch_size: int,
    desc: str = "pass",
    outs: list[np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Residual stream after decoder layer `layer` (1-based) at probe_pos, [N, D] per condition (the pass
    stops there). A condition is a dict: `seqs` (absent: `seqs`; else same-length token ids, e.g. patched),
    `edges` = (queries, keys) per sample and `factor` (those attention edges reweighted in every layer). The
    tokens all conditions share with the clean sequences run once per batch (`_first_change`)."""
    layers = decoder_layers(lm.model)
    if not 1 <= layer <= len(layers):
        raise ValueError(f"layer {layer} is not in 1..{len(layers)}")
    base, device, dtype, pad_id = model_parts(lm)
    if outs is None:
        hidden = lm.model.config.get_text_config().hidden_size
        outs = [np.zeros((len(seqs), hidden), dtype=np.float16) for _ in conditions]
    cut = [s[: p + 1] for s, p in zip(seqs, probe_pos, strict=True)]
    conds = []
    for c in conditions:
        cs = (
            None if c.get("seqs") is None else [s[: p + 1] for s, p in zip(c["seqs"], probe_pos, strict=True)]
        )
        if cs is not None and [len(s) for s in cs] != [len(s) for s in cut]:
            raise ValueError("a condition's sequences must keep every sample's length")
        conds.append({"seqs": cs, "edges": c.get("edges"), "factor": float(c.get("factor", 1.0))})
    order = sorted(range(len(cut)), key=lambda i: -len(cut[i]))

    def inputs(idx, ids, valid):
        """(token ids, mask) of each condition on the batch."""
        lengths = [len(cut[i]) for i in idx]
        for c in conds:
            c_ids = (
                ids if c["seqs"] is None else _batch_tensors([c["seqs"][i] for i in idx], pad_id, device)[0]
            )
            if c["edges"] is None or c["factor"] == 1.0:
                yield c_ids, knockout_mask(valid, None, dtype)
                continue
            q = positions_tensor([c["edges"][0][i] for i in idx], lengths, ids.shape, device)
            k = positions_tensor([c["edges"][1][i] for i in idx], lengths, ids.shape, device)
            yield c_ids, reweight_mask(valid, q, k, c["factor"], dtype)

    def step(idx: list[int]) -> None:
        ids, valid = _batch_tensors([cut[i] for i in idx], pad_id, device)
        prefix = _first_change(cut, conds, idx, [len(cut[i]) for i in idx])
        prefix = prefix if prefix >= MIN_SHARED_PREFIX else 0
        cap = ResidCapture(layers, stop_after=layer - 1)
        try:
            probes = [probe_pos[i] for i in idx]
            passes = condition_passes(base, cap, ids, valid, probes, prefix, inputs(idx, ids, valid))
            for n, (_, out) in enumerate(zip(passes, outs, strict=True)):
                store(out, idx, cap.resid_post[layer - 1].float().cpu().numpy(), f"{desc}: condition {n}")
        finally:
            cap.remove()

    run_batched(order, batch_size, step, desc=desc)
    return outs


# ------------------------------------------------------------------ detection baselines (A17)
def logits_at(model, resid: torch.Tensor, at: list[list[int]], offset: int = 0) -> torch.Tensor:
    """Float32 logits [sum of len(at[r]), V] predicting the token after each position at[r] of row r, from a
    residual stream [B, T, D] (positions offset..) taken under `unnormed`; the final norm and the LM head run
    on those positions only (a [B, T, V] tensor of a 262k vocabulary would not fit), in one call per batch
    (the head's weights are read once). Index tensors follow the tensor they index (on the last GPU)."""
    row_of = torch.tensor([r for r, pos in enumerate(at) for _ in pos], device=resid.device)
    cols = torch.tensor([p - offset for pos in at for p in pos], device=resid.device)
    return float_logits(model, resid[row_of, cols])


def next_token_logits(lm: LoadedModel, rows: list[list[int]], at: list[list[int]]) -> torch.Tensor:
    """`logits_at` of one right-padded pass over rows (the shared head run once, `head_cache`)."""
    base, device, dtype, pad_id = model_parts(lm)
    ids, valid = _batch_tensors(rows, pad_id, device)
    head = common_head(rows, min(p for pos in at for p in pos))
    head = head if head >= MIN_SHARED_PREFIX else 0
    with unnormed(lm.model):
        h = last_hidden_after_head(base, ids, valid, head, dtype)
    return logits_at(lm.model, h, at, head)


def logprob_stats(logits: torch.Tensor, targets: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Logits-mean / Logits-min of each row: the mean and the minimum log-probability of its target tokens,
    targets[r] scored by consecutive rows of `logits` (`logits_at`); NaN for a row without targets."""
    lp = torch.log_softmax(logits, dim=-1)
    flat = torch.tensor([t for ts in targets for t in ts], device=lp.device)
    vals = lp[torch.arange(len(flat), device=lp.device), flat].cpu().numpy()
    per_row = np.split(vals, np.cumsum([len(t) for t in targets])[:-1])
    return tuple(np.array([f(v) if len(v) else math.nan for v in per_row]) for f in (np.mean, np.min))


@torch.inference_mode()
def answer_logprobs(
    lm: LoadedModel,
    seqs: list[list[int]],
    ea_positions: list[list[int]],
    batch_size: int,
    desc: str = "logits",
) -> tuple[np.ndarray, np.ndarray]:
    """Logits-mean / Logits-min of the E_A tokens, teacher-forced (token at position p scored from position
    p-1), from their own clean pass. The workflow takes them from the saliency pass instead (`saliency`,
    the same `logits_at` and `logprob_stats` on its residual stream); this is the separate computation its
    tests compare with."""
    mean = np.full(len(seqs), np.nan)
    low = np.full(len(seqs), np.nan)
    ends = [max(e) + 1 if e else 0 for e in ea_positions]
    order = sorted(range(len(seqs)), key=lambda i: -ends[i])

    def step(idx: list[int]) -> None:
        scored = [[p for p in ea_positions[i] if p >= 1] for i in idx]
        if not any(scored):
            return
        rows = [seqs[i][: max(1, ends[i])] for i in idx]
        logits = next_token_logits(lm, rows, [[p - 1 for p in pos] for pos in scored])
        targets = [[seqs[i][p] for p in pos] for i, pos in zip(idx, scored, strict=True)]
        mean[idx], low[idx] = logprob_stats(logits, targets)

    run_batched(order, batch_size, step, desc=desc)
    return mean, low


P_TRUE_TEMPLATE = (
    "Question: {question}\nProposed answer: {answer}\n"
    "Is the proposed answer true or false? Reply with one word: True or False."
)


def verdict_token_ids(tokenizer) -> tuple[list[int], list[int]]:
    """First token ids of 'True' and 'False', with and without a leading space (deduplicated)."""

    def first(words):  # each word's first token id, deduplicated in order
        encoded = [tokenizer(w, add_special_tokens=False)["input_ids"] for w in words]
        return list(dict.fromkeys(ids[0] for ids in encoded if ids))

    t, f = first(["True", " True", "true", " true"]), first(["False", " False", "false", " false"])
    return [i for i in t if i not in f], [i for i in f if i not in t]


@torch.inference_mode()
def p_true(lm: LoadedModel, prompts: list[list[int]], batch_size: int, desc: str = "P(True)") -> np.ndarray:
    """P(True) (Kadavath et al. 2022): the probability of 'True' against 'False' as the next token after a
    prompt asking whether the proposed answer is true, softmax over the two sets of first-token ids."""
    t_ids, f_ids = verdict_token_ids(lm.tokenizer)
    out = np.full(len(prompts), np.nan)
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))

    def step(idx: list[int]) -> None:
        logits = next_token_logits(lm, [prompts[i] for i in idx], [[len(prompts[i]) - 1] for i in idx])
        lt = torch.logsumexp(logits[:, t_ids], dim=-1)
        lf = torch.logsumexp(logits[:, f_ids], dim=-1)
        out[idx] = torch.sigmoid(lt - lf).cpu().numpy()

    run_batched(order, batch_size, step, desc=desc)
    return out
