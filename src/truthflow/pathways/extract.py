"""The extraction job of one (model, dataset): exact tokens, clean + knocked-out residual streams at the last
E_A token, and the drop table (METHOD A3-A7)."""

from __future__ import annotations

import random
import zlib

import numpy as np
import polars as pl

from ..generation import build_prompt, generate_answers
from ..models import LoadedModel
from . import tokens as et
from .knockout import resid_sweep_multi

EA_PROMPT = (
    "Copy, word for word, the short answer (a name, number or short phrase) that this response gives "
    "to the question.\nQuestion: {question}\nResponse: {answer}\nShort answer:"
)
EQ_PROMPT = (
    "Copy, word for word, the subject and the property words of this question, separated by ' | '."
    "\nQuestion: {question}\nWords:"
)


def _find_spans(text: str, parts: list[str]) -> list[tuple[int, int]]:
    spans = []
    for part in parts:
        part = part.strip(" .\"'")
        i = text.find(part) if part else -1
        if i >= 0:
            spans.append((i, i + len(part)))
    return spans


def llm_spans(
    lm: LoadedModel,
    chat: bool,
    questions: list[str],
    answers: list[str],
    batch_size: int,
    template_kwargs: dict | None = None,
) -> tuple[list[tuple[int, int] | None], list[list[tuple[int, int]]]]:
    """The LLM extractor option (as LLMsKnow): the model copies the short answer and the question's
    subject/property words; a copy not found verbatim gives None/[] (the caller falls back).
    template_kwargs go to the chat template, as for the answers (Qwen3: {"enable_thinking": False}); a
    reasoning block in a copy is stripped by generate_answers."""

    def ask(template, fields):
        prompts = [
            build_prompt(
                lm.tokenizer, template.format(**f), chat, instruction="", template_kwargs=template_kwargs
            )
            for f in fields
        ]
        return [
            o["answer"]
            for o in generate_answers(
                lm, prompts, batch_size, 16, stop_at_newline=True, chat=chat, desc="llm extractor"
            )
        ]

    ea_out = ask(EA_PROMPT, [{"question": q, "answer": a} for q, a in zip(questions, answers, strict=True)])
    eq_out = ask(EQ_PROMPT, [{"question": q} for q in questions])
    ea = []
    for ans, copy in zip(answers, ea_out, strict=True):
        found = _find_spans(ans, [copy])
        ea.append(found[0] if found else None)
    eq = [_find_spans(q, copy.split("|")) for q, copy in zip(questions, eq_out, strict=True)]
    return ea, eq


def locate_all(
    lm: LoadedModel,
    chat: bool,
    dataset: str,
    table: pl.DataFrame,
    extractor: str = "deterministic",
    batch_size: int = 32,
    template_kwargs: dict | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """table: labelled answers joined with their questions. Returns (kept samples with token positions,
    dropped samples with their reason)."""
    rows = table.to_dicts()
    llm_ea: list = [None] * len(rows)
    llm_eq: list = [[] for _ in rows]
    if extractor == "llm":
        llm_ea, llm_eq = llm_spans(
            lm, chat, [r["question"] for r in rows], [r["answer"] for r in rows], batch_size, template_kwargs
        )
    kept, dropped = [], []
    for i, r in enumerate(rows):
        if r["correct"]:
            ea_span = (r["match_start"], r["match_end"])
        else:
            ea_span = llm_ea[i] or et.short_answer_span(r["answer"], question=r["question"])
        eq_spans = llm_eq[i] or et.question_spans(r["question"], dataset, r.get("subj"), r.get("prop"))
        eq, ea, qpos, reason = et.locate(
            lm.tokenizer,
            r["prompt"],
            r["prompt_ids"],
            chat,
            r["question"],
            eq_spans,
            r["answer_ids"],
            ea_span,
        )
        if reason:
            dropped.append({"id": r["id"], "reason": reason})
            continue
        kept.append(
            {
                "id": r["id"],
                "correct": bool(r["correct"]),
                "refusal": bool(r["refusal"]),
                "seq": list(r["prompt_ids"]) + list(r["answer_ids"]),
                "eq_positions": eq,
                "ea_positions": ea,
                "probe_position": ea[-1],
                "question_positions": qpos,
                "eq_text": " | ".join(r["question"][s:e] for s, e in eq_spans),
                "ea_text": lm.tokenizer.decode(
                    [r["answer_ids"][p - len(r["prompt_ids"])] for p in ea]
                ).strip(),
            }
        )
    kept_df = (
        pl.DataFrame(
            kept,
            schema_overrides={
                "seq": pl.List(pl.Int64),
                "eq_positions": pl.List(pl.Int64),
                "ea_positions": pl.List(pl.Int64),
                "question_positions": pl.List(pl.Int64),
            },
        )
        if kept
        else None
    )
    dropped_df = pl.DataFrame(dropped, schema={"id": pl.String, "reason": pl.String})
    return kept_df, dropped_df


def control_positions(
    sample_id: str, eq: list[int], question: list[int], seed: int, draw: int = 0
) -> list[int] | None:
    """One draw of the random control (METHOD A7): exactly |E_Q| question tokens outside E_Q, chosen with a
    seed of (seed, draw, sample id). None when the question has fewer non-E_Q tokens than E_Q has: such a
    sample cannot be matched and is counted, never blocked with a shorter set."""
    pool = sorted(set(question) - set(eq))
    if len(pool) < len(eq):
        return None
    rng = random.Random(f"{seed}:{draw}:{zlib.crc32(sample_id.encode())}")
    return sorted(rng.sample(pool, len(eq)))


# the draw index of a `target: random` knockout: never one of the control draws (0..control_draws-1)
TARGET_RANDOM_DRAW = 1_000


def knockout_blocks(
    kept: pl.DataFrame, target: str, control_draws: int, control_seed: int
) -> tuple[list[list[int]], list[list[list[int]]], list[bool]]:
    """Blocked positions per sample: the target condition (E_Q, or one random draw for the negative
    control run `target: random`) and `control_draws` matched random-control draws. A sample whose question
    has too few non-E_Q tokens gets matched=False (its control rows then block nothing and are left out of
    every E_Q-vs-control comparison)."""
    ids = kept["id"].to_list()
    eqs = kept["eq_positions"].to_list()
    qs = kept["question_positions"].to_list()
    matched = [True] * len(ids)

    def draw(d: int) -> list[list[int]]:
        out = []
        for i, (sid, eq, q) in enumerate(zip(ids, eqs, qs, strict=True)):
            pos = control_positions(sid, eq, q, control_seed, d)
            if pos is None:
                matched[i] = False
                pos = []
            out.append(pos)
        return out

    if target == "exact_question":
        target_blocks = [list(e) for e in eqs]
    elif target == "random":
        target_blocks = draw(TARGET_RANDOM_DRAW)
    else:
        raise ValueError(f"unknown knockout target '{target}' (exact_question | random)")
    controls = [draw(d) for d in range(control_draws)]
    return target_blocks, controls, matched


def extract(
    lm: LoadedModel,
    kept: pl.DataFrame,
    batch_size: int,
    mode: str,
    window: int,
    target: str,
    control_draws: int,
    control_seed: int,
    desc: str,
    out: tuple[np.ndarray, list[np.ndarray]] | None = None,
) -> tuple[np.ndarray, list[np.ndarray], list[list[int]], list[list[list[int]]], list[bool]]:
    """Clean pass + the target knockout + each control draw. Returns (resid_clean, [resid_ko target,
    resid_ko control draw 0, ...], target blocks, control blocks per draw, matched)."""
    seqs = kept["seq"].to_list()
    probe = kept["probe_position"].to_list()
    target_blocks, controls, matched = knockout_blocks(kept, target, control_draws, control_seed)
    clean, kos = resid_sweep_multi(
        lm, seqs, probe, [target_blocks, *controls], batch_size, mode=mode, window=window, desc=desc, out=out
    )
    return clean, kos, target_blocks, controls, matched
