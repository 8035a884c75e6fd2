"""The extraction jobs of one (model, dataset): exact tokens, clean + knocked-out residual streams at the last
E_A token and the drop table (METHOD A3-A7); the new states and scores of the Section 3.2-5 experiments at
layer K (A12-A17)."""

from __future__ import annotations

import random
import zlib

import numpy as np
import polars as pl

from ..engine import Condition, resid_states
from ..generation import build_prompt, encode_prompt, generate_answers
from ..models import LoadedModel
from . import interventions as iv
from . import tokens as et
from .experiments import SALIENCY_SCHEMA, SCORES_SCHEMA
from .saliency import saliency

_POS = pl.List(pl.Int64)
# samples.parquet, the kept samples with their token positions and knockout blocks
SAMPLES_SCHEMA = {"id": pl.String, "correct": pl.Boolean, "refusal": pl.Boolean, "eq_positions": _POS,
                  "ea_positions": _POS, "probe_position": pl.Int64, "question_positions": _POS,
                  "eq_text": pl.String, "ea_text": pl.String, "blocked_positions": _POS,
                  "control_positions": pl.List(_POS), "control_matched": pl.Boolean, "n_eq": pl.Int64,
                  "n_ea": pl.Int64}  # fmt: skip


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
    subject/property words; a copy not found verbatim gives None/[] (the caller falls back). template_kwargs
    go to the chat template, as for the answers; generate_answers strips a reasoning block in a copy."""

    def ask(template, fields):
        kw = {"instruction": "", "template_kwargs": template_kwargs}
        prompts = [build_prompt(lm.tokenizer, template.format(**f), chat, **kw) for f in fields]
        out = generate_answers(
            lm, prompts, batch_size, 16, stop_at_newline=True, chat=chat, desc="llm extractor"
        )
        return [o["answer"] for o in out]

    ea_out = ask(EA_PROMPT, [{"question": q, "answer": a} for q, a in zip(questions, answers, strict=True)])
    eq_out = ask(EQ_PROMPT, [{"question": q} for q in questions])
    ea = [next(iter(_find_spans(ans, [copy])), None) for ans, copy in zip(answers, ea_out, strict=True)]
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
    """table: labelled answers joined with their questions. Returns (kept samples with their token sequence,
    answer start and token positions, dropped samples with their reason)."""
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
                "answer_start": len(r["prompt_ids"]),
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
    # kept: the samples table's columns up to ea_text and the token sequence
    kept_columns = list(SAMPLES_SCHEMA)[: list(SAMPLES_SCHEMA).index("ea_text") + 1]
    schema = {"seq": _POS, "answer_start": pl.Int64, **{c: SAMPLES_SCHEMA[c] for c in kept_columns}}
    return pl.DataFrame(kept, schema=schema), pl.DataFrame(
        dropped, schema={"id": pl.String, "reason": pl.String}
    )


def control_positions(
    sample_id: str, eq: list[int], question: list[int], seed: int, draw: int = 0
) -> list[int] | None:
    """One draw of the random control (METHOD A7): exactly |E_Q| question tokens outside E_Q, seeded by
    (seed, draw, sample id); None when the question has fewer non-E_Q tokens (an unmatched sample)."""
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
    control run `target: random`) and `control_draws` matched random-control draws. An unmatched sample
    (`control_positions` None) has control rows that block nothing."""
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

    # target: exact_question or random (the schema's enum)
    target_blocks = draw(TARGET_RANDOM_DRAW) if target == "random" else [list(e) for e in eqs]
    controls = [draw(d) for d in range(control_draws)]
    return target_blocks, controls, matched


def extract(
    lm: LoadedModel,
    kept: pl.DataFrame,
    batch_size: int,
    knockout: dict,
    saliency_batch: int,
    desc: str,
    out=None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The clean states, the target knockout and each control draw (knockout: pathways.knockout), written
    into out = (resid_clean, [resid_ko target, resid_ko control draw 0, ...]) (None: float16 arrays, thrown
    away), and the attention saliency and Logits-mean/min of every kept sample (A15, A17). The clean states
    come off the saliency pass, a clean pass over the whole sequence; the knockout (METHOD A7: one pass with
    the block in every layer gives every layer's cumulative knockout; window mode, one truncated pass per
    layer) runs no clean pass of its own. Returns (SAMPLES_SCHEMA's table, SALIENCY_SCHEMA's table)."""
    draws = knockout["control_draws"]
    target_blocks, controls, matched = knockout_blocks(
        kept, knockout["target"], draws, knockout["control_seed"]
    )
    ids, seqs, probe = kept["id"].to_list(), kept["seq"].to_list(), kept["probe_position"].to_list()
    window = knockout["window"] if knockout["mode"] == "window" else None
    names = ["resid_ko", *(f"resid_control draw {d}" for d in range(draws))]
    blocks = [target_blocks, *controls]
    conditions = [Condition(block=b, window=window, name=n) for b, n in zip(blocks, names, strict=True)]
    if out is None:
        shape = (kept.height, lm.info["n_layers"], lm.info["hidden_size"])
        out = (np.zeros(shape, np.float16), [np.zeros(shape, np.float16) for _ in conditions])
    sal = None
    if kept.height:
        eq, ea = kept["eq_positions"].to_list(), kept["ea_positions"].to_list()
        sal = saliency(
            lm,
            seqs,
            kept["answer_start"].to_list(),
            eq,
            ea,
            saliency_batch,
            f"saliency {desc}",
            (probe, out[0]),
        )
        resid_states(lm, seqs, probe, conditions, batch_size, out=out[1], desc=desc)
    values = {c: [] for c in SALIENCY_SCHEMA if c != "id"}
    if sal is not None:
        values = {
            "logit_mean": sal.logit_mean,
            "logit_min": sal.logit_min,
            "s_eq_ea": sal.scores[:, :, 0].tolist(),
            "s_eq_all": sal.scores[:, :, 1].tolist(),
        }
    scores = pl.DataFrame({"id": ids, **values}, schema=SALIENCY_SCHEMA)
    n_unmatched = len(matched) - sum(matched)
    if n_unmatched:
        print(
            f"{desc}: {n_unmatched} samples have fewer non-E_Q question tokens than |E_Q|: no matched random"
            " control; they are left out of the E_Q-vs-control check (counted there)",
            flush=True,
        )
    return kept.with_columns(
        pl.Series("blocked_positions", target_blocks, dtype=_POS),
        pl.Series(
            "control_positions",
            [list(c) for c in zip(*controls, strict=True)] if draws else [[]] * len(matched),
            dtype=pl.List(_POS),
        ),
        pl.Series("control_matched", matched, dtype=pl.Boolean),
        pl.col("eq_positions").list.len().cast(pl.Int64).alias("n_eq"),
        pl.col("ea_positions").list.len().cast(pl.Int64).alias("n_ea"),
    ).select(list(SAMPLES_SCHEMA)), scores


def experiment_states(
    lm: LoadedModel, table: pl.DataFrame, layer: int, cfg: dict, batch_size: int, prompt: dict, outs, name
) -> pl.DataFrame:
    """The new states at layer K for `table` (samples.parquet joined with their labels, question and
    saliency.parquet), written into outs = (patch [2, N, D]: E_Q and control patched; answer-only [N, D];
    PR [2·F, N, D]: ×f and ×1/f per factor f). Returns the per-sample scores (SCORES_SCHEMA): donors,
    P(True), and the table's answer log-probabilities and saliency per layer. cfg: pathways.experiments;
    prompt: chat, template_kwargs (P(True)'s prompt is built like the answers')."""
    if table.height == 0:
        return pl.DataFrame(schema=SCORES_SCHEMA)
    patch, answer_only, pr = outs
    n, ids = table.height, table["id"].to_list()
    scores = {"id": ids, "layer": [layer] * n}
    seqs = [list(p) + list(a) for p, a in zip(table["prompt_ids"], table["answer_ids"], strict=True)]
    prompt_lens = table["prompt_ids"].list.len().to_list()
    eq, probe = (table[c].to_list() for c in ("eq_positions", "probe_position"))
    ctrl0 = [
        c[0] if m and c else None
        for c, m in zip(table["control_positions"].to_list(), table["control_matched"], strict=True)
    ]
    inputs = iv.patched_inputs(ids, seqs, eq, ctrl0, cfg["patch_seed"])
    patched = [Condition(tokens=inputs["target"]), Condition(tokens=inputs["control"])]
    resid_states(lm, seqs, probe, patched, batch_size, layer, list(patch), f"patching {name}")
    bos = lm.tokenizer.bos_token_id
    bos = bos if bos is not None and seqs[0][:1] == [bos] else None
    ao_seqs, ao_pos = iv.answer_only_inputs(seqs, prompt_lens, probe, bos)
    resid_states(lm, ao_seqs, ao_pos, [Condition()], batch_size, layer, [answer_only], f"answer only {name}")
    answer_pos = [list(range(start, p + 1)) for start, p in zip(prompt_lens, probe, strict=True)]
    conds = iv.reweighting(answer_pos, eq, cfg["pr_factors"])
    resid_states(lm, seqs, probe, conds, batch_size, layer, list(pr), f"PR {name}")
    chat, kw = prompt["chat"], {"instruction": "", "template_kwargs": prompt["template_kwargs"]}
    texts = [
        iv.P_TRUE_TEMPLATE.format(question=q, answer=a.strip())
        for q, a in zip(table["question"], table["answer"], strict=True)
    ]
    prompts = [encode_prompt(lm.tokenizer, build_prompt(lm.tokenizer, t, chat, **kw), chat) for t in texts]
    scores.update(
        donor=inputs["donor"],
        donor_length_matched=inputs["length_matched"],
        patch_control_matched=[c is not None for c in ctrl0],
        p_true=iv.p_true(lm, prompts, batch_size, desc=f"P(True) {name}"),
        **{c: table[c] for c in SALIENCY_SCHEMA if c != "id"},  # extract_pathways' saliency pass
    )
    return pl.DataFrame(scores, schema=SCORES_SCHEMA)
