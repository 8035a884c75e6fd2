"""The inputs of the Section 3.2-5 experiments (docs/method.md A12-A17), as engine conditions: token patching
(E_Q ids replaced by a donor's), the answer alone, Pathway Reweighting (attention on E_Q -> answer edges
scaled); and the detection baselines (P(True), Logits-mean/min of the answer tokens)."""

import math
import random
import zlib

import numpy as np
import torch

from ..engine import Condition, Logits, run
from ..models import LoadedModel


# ------------------------------------------------------------------ token patching (A12)
def choose_donors(ids: list[str], eq_lengths: list[int], seed: int) -> list[tuple[int, bool]]:
    """Donor of each sample (METHOD A12): (donor index, length_matched) per sample; (-1, False) for a dataset
    of one sample."""
    by_len: dict[int, list[int]] = {}
    for i, n in enumerate(eq_lengths):
        by_len.setdefault(n, []).append(i)
    out = []
    for i, sid in enumerate(ids):
        rng = random.Random(f"{seed}:{zlib.crc32(sid.encode())}")
        same = [j for j in by_len[eq_lengths[i]] if j != i]
        pool = same or [j for j in range(len(ids)) if j != i]
        out.append((rng.choice(pool), bool(same)) if pool else (-1, False))
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
    target, control = [], []
    for i, ((j, _), ctrl) in enumerate(zip(donors, control_positions, strict=True)):
        toks = donor_tokens(eq_ids[j], len(eq_positions[i])) if j >= 0 else []
        ok = j >= 0 and len(toks) == len(eq_positions[i])
        target.append(patch(seqs[i], eq_positions[i], toks) if ok else list(seqs[i]))
        control.append(patch(seqs[i], ctrl, toks) if ok and ctrl else list(seqs[i]))
    donor = [ids[j] if j >= 0 else "" for j, _ in donors]
    return {"target": target, "control": control, "donor": donor, "length_matched": [m for _, m in donors]}


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
def reweighting(answer_pos: list[list[int]], eq: list[list[int]], factors: list[float]) -> list[Condition]:
    """The PR conditions (METHOD A16): every answer token (query) attending an E_Q token (key), its weight
    scaled by f and by 1/f for each factor f, in that order."""
    return [Condition(edges=(answer_pos, eq), factor=fac) for f in factors for fac in (float(f), 1 / f)]


# ------------------------------------------------------------------ detection baselines (A17)
def target_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p of each row's target token under float32 logits [n, V] (an `engine.Logits` reduce)."""
    logprobs = torch.log_softmax(logits, dim=-1)
    return logprobs[torch.arange(len(targets), device=logprobs.device), targets]


def logit_baselines(token_logprobs: list[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
    """Logits-mean and Logits-min of each sample: the mean and min log-probability of its E_A tokens
    (`target_logprobs`); NaN for a sample without scored tokens."""
    scored = [v if v is not None and len(v) else None for v in token_logprobs]
    # each statistic in the values' own float32 (as the pass gives them), stored as float64
    mean, low = ([math.nan if v is None else f(v) for v in scored] for f in (np.mean, np.min))
    return np.array(mean, dtype=np.float64), np.array(low, dtype=np.float64)


P_TRUE_TEMPLATE = (
    "Question: {question}\nProposed answer: {answer}\n"
    "Is the proposed answer true or false? Reply with one word: True or False."
)


def verdict_token_ids(tokenizer) -> tuple[list[int], list[int]]:
    """First token ids of 'True' and 'False', with and without a leading space (deduplicated)."""

    def first(words):
        encoded = [tokenizer(w, add_special_tokens=False)["input_ids"] for w in words]
        return list(dict.fromkeys(ids[0] for ids in encoded if ids))

    t, f = first(["True", " True", "true", " true"]), first(["False", " False", "false", " false"])
    return [i for i in t if i not in f], [i for i in f if i not in t]


def p_true(lm: LoadedModel, prompts: list[list[int]], batch_size: int, desc: str = "P(True)") -> np.ndarray:
    """P(True) (Kadavath et al. 2022): the probability of 'True' against 'False' as the next token after a
    prompt asking whether the proposed answer is true, softmax over the two sets of first-token ids."""
    t_ids, f_ids = verdict_token_ids(lm.tokenizer)

    def true_against_false(logits: torch.Tensor, _next_ids: torch.Tensor) -> torch.Tensor:
        lt, lf = (torch.logsumexp(logits[:, ids], dim=-1) for ids in (t_ids, f_ids))
        return torch.sigmoid(lt - lf)

    last = Logits([[len(p) - 1] for p in prompts], true_against_false)
    return np.array([float(v[0]) for v in run(lm, prompts, last, batch_size, desc=desc)], dtype=np.float64)
