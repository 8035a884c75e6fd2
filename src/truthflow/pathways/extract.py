"""The extraction jobs of one (model, dataset): exact tokens, clean + knocked-out residual streams at the last
E_A token and the drop table (METHOD A3-A7); the new states and scores of the Section 3.2-5 experiments at
layer K (A12-A17)."""

import random
import zlib

import numpy as np
import polars as pl

from ..engine import Condition, Resid, run
from ..generation import build_prompt, encode_prompt, generate_answers
from ..models import LoadedModel
from .activations import knockout_out, resid_shapes
from .experiments import SALIENCY_SCHEMA, SCORES_SCHEMA
from .interventions import P_TRUE_TEMPLATE, answer_only_inputs, p_true, patched_inputs, reweighting
from .saliency import saliency
from .spans import locate, question_spans, short_answer_span

_POS = pl.List(pl.Int64)
# the kept samples with their token positions
_LOCATED = {
    "id": pl.String,
    "correct": pl.Boolean,
    "refusal": pl.Boolean,
    "eq_positions": _POS,
    "ea_positions": _POS,
    "probe_position": pl.Int64,
    "question_positions": _POS,
    "eq_text": pl.String,
    "ea_text": pl.String,
}
# locate_spans' table: the located samples with their token sequence and where its answer starts
LOCATED_SCHEMA = {"seq": _POS, "answer_start": pl.Int64, **_LOCATED}
# samples.parquet: the located samples with their knockout blocks
SAMPLES_SCHEMA = _LOCATED | {
    "blocked_positions": _POS,
    "control_positions": pl.List(_POS),
    "control_matched": pl.Boolean,
    "n_eq": pl.Int64,
    "n_ea": pl.Int64,
}


EA_PROMPT = (
    "Copy, word for word, the short answer (a name, number or short phrase) that this response gives "
    "to the question.\nQuestion: {question}\nResponse: {answer}\nShort answer:"
)
EQ_PROMPT = (
    "Copy, word for word, the subject and the property words of this question, separated by ' | '."
    "\nQuestion: {question}\nWords:"
)


def _find_spans(text: str, parts: list[str]) -> list[tuple[int, int]]:
    stripped = [part.strip(" .\"'") for part in parts]
    return [(i, i + len(part)) for part in stripped if part and (i := text.find(part)) >= 0]


def llm_spans(
    lm: LoadedModel,
    chat: bool,
    questions: list[str],
    answers: list[str],
    batch_size: int,
    chat_template_kwargs: dict | None = None,
) -> tuple[list[tuple[int, int] | None], list[list[tuple[int, int]]]]:
    """The LLM extractor option (as LLMsKnow): the model copies the short answer and the question's
    subject/property words; a copy not found verbatim gives None/[] (the caller falls back). The chat
    template gets chat_template_kwargs, as for the answers; generate_answers strips a reasoning block."""

    def ask(template, fields):
        kw = {"instruction": "", "chat_template_kwargs": chat_template_kwargs}
        prompts = [build_prompt(lm.tokenizer, template.format(**f), chat, **kw) for f in fields]
        out = generate_answers(
            lm, prompts, batch_size, 16, stop_at_newline=True, chat=chat, desc="llm extractor"
        )
        return [o["answer"] for o in out]

    ea_out = ask(EA_PROMPT, [{"question": q, "answer": a} for q, a in zip(questions, answers, strict=True)])
    eq_out = ask(EQ_PROMPT, [{"question": q} for q in questions])
    ea = [next(iter(_find_spans(ans, [copy])), None) for ans, copy in zip(answers, ea_out, strict=True)]
    return ea, [_find_spans(q, copy.split("|")) for q, copy in zip(questions, eq_out, strict=True)]


def locate_spans(
    lm: LoadedModel,
    chat: bool,
    dataset: str,
    table: pl.DataFrame,
    extractor: str = "deterministic",
    batch_size: int = 32,
    chat_template_kwargs: dict | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """E_Q and E_A of every labelled answer (`table`, joined with its question) as token positions.
    Returns (the located samples, LOCATED_SCHEMA; the dropped samples with their reason)."""
    rows = table.to_dicts()
    questions, answers = [r["question"] for r in rows], [r["answer"] for r in rows]
    llm_ea, llm_eq = [None] * len(rows), [[] for _ in rows]
    if extractor == "llm":
        llm_ea, llm_eq = llm_spans(lm, chat, questions, answers, batch_size, chat_template_kwargs)
    kept, dropped = [], []
    for r, ea_llm, eq_llm in zip(rows, llm_ea, llm_eq, strict=True):
        q, start = r["question"], len(r["prompt_ids"])
        matched = (r["match_start"], r["match_end"]) if r["correct"] else None
        ea_span = matched or ea_llm or short_answer_span(r["answer"], question=q)
        eq_spans = eq_llm or question_spans(q, dataset, r.get("subj"), r.get("prop"))
        eq, ea, qpos, reason = locate(
            lm.tokenizer, r["prompt"], r["prompt_ids"], chat, q, eq_spans, r["answer_ids"], ea_span
        )
        if reason:
            dropped.append({"id": r["id"], "reason": reason})
            continue
        ea_text = lm.tokenizer.decode([r["answer_ids"][p - start] for p in ea]).strip()
        eq_text = " | ".join(q[s:e] for s, e in eq_spans)
        seq, flags = r["prompt_ids"] + r["answer_ids"], (bool(r["correct"]), bool(r["refusal"]))
        kept.append((seq, start, r["id"], *flags, eq, ea, ea[-1], qpos, eq_text, ea_text))
    dropped = pl.DataFrame(dropped, schema={"id": pl.String, "reason": pl.String})
    return pl.DataFrame(kept, schema=LOCATED_SCHEMA, orient="row"), dropped


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
    ids, eqs, qs = (kept[c].to_list() for c in ("id", "eq_positions", "question_positions"))
    matched = [True] * len(ids)

    def draw(d: int) -> list[list[int]]:
        out = [control_positions(s, eq, q, control_seed, d) for s, eq, q in zip(ids, eqs, qs, strict=True)]
        for i, pos in enumerate(out):
            matched[i] = matched[i] and pos is not None
        return [pos or [] for pos in out]

    target_blocks = draw(TARGET_RANDOM_DRAW) if target == "random" else [list(e) for e in eqs]
    controls = [draw(d) for d in range(control_draws)]
    return target_blocks, controls, matched


def knockout_states(
    lm: LoadedModel,
    kept: pl.DataFrame,
    batch_size: int,
    knockout: dict,
    saliency_batch: int,
    desc: str,
    out=None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The clean states, the target knockout and each control draw (METHOD A7; knockout: pathways.knockout)
    written into out (`activations.knockout_out`'s layout; None: thrown away), all from one engine run: the
    clean state is a condition of its own beside the knockouts, so every state comes from the same kind of
    pass (kernel, batch, shared-prefix cache) and a ΔP holds no kernel's rounding. Returns (SAMPLES_SCHEMA's
    table, SALIENCY_SCHEMA's: the saliency and Logits-mean/min off the saliency pass, A15, A17)."""
    draws = knockout["control_draws"]
    target_blocks, controls, matched = knockout_blocks(
        kept, knockout["target"], draws, knockout["control_seed"]
    )
    ids, seqs, probe = kept["id"].to_list(), kept["seq"].to_list(), kept["probe_position"].to_list()
    window = knockout["window"] if knockout["mode"] == "window" else None
    blocks = {"resid_ko": target_blocks} | {f"resid_control draw {d}": c for d, c in enumerate(controls)}
    knocked = [Condition(block=b, window=window, name=n) for n, b in blocks.items()]
    # the clean condition changes no token: the prefix the knockouts share with it still runs once a batch
    conditions = [Condition(name="resid_clean"), *knocked]
    if out is None:
        shapes = resid_shapes(kept.height, lm.info["n_layers"], lm.info["hidden_size"], draws).values()
        out = knockout_out(*(np.zeros(shape, np.float32) for shape in shapes))
    values = {c: [] for c in SALIENCY_SCHEMA if c != "id"}
    if kept.height:
        eq, ea, start = (kept[c].to_list() for c in ("eq_positions", "ea_positions", "answer_start"))
        sal = saliency(lm, seqs, start, eq, ea, saliency_batch, f"saliency {desc}")
        run(lm, seqs, Resid(probe, out=[out[0], *out[1]]), batch_size, conditions, desc=desc)
        s_eq_ea, s_eq_all = sal.scores[:, :, 0].tolist(), sal.scores[:, :, 1].tolist()
        values = dict(logit_mean=sal.logit_mean, logit_min=sal.logit_min, s_eq_ea=s_eq_ea, s_eq_all=s_eq_all)
    scores = pl.DataFrame({"id": ids, **values}, schema=SALIENCY_SCHEMA)
    n_unmatched = len(matched) - sum(matched)
    if n_unmatched:
        print(
            f"{desc}: {n_unmatched} samples have fewer non-E_Q question tokens than |E_Q|: no matched random"
            " control; they are left out of the E_Q-vs-control check (counted there)",
            flush=True,
        )
    per_sample = [[c[i] for c in controls] for i in range(len(ids))]
    return kept.with_columns(
        pl.Series("blocked_positions", target_blocks, dtype=_POS),
        pl.Series("control_positions", per_sample, dtype=pl.List(_POS)),
        pl.Series("control_matched", matched, dtype=pl.Boolean),
        pl.col("eq_positions").list.len().cast(pl.Int64).alias("n_eq"),
        pl.col("ea_positions").list.len().cast(pl.Int64).alias("n_ea"),
    ).select(list(SAMPLES_SCHEMA)), scores


def experiment_states(
    lm: LoadedModel,
    table: pl.DataFrame,
    layer: int,
    cfg: dict,
    batch_size: int,
    chat: bool,
    chat_template_kwargs: dict | None,
    outs,
    name: str,
) -> pl.DataFrame:
    """The new states at layer K for `table` (samples.parquet joined with labels, question and saliency),
    written into outs = (patch, answer_only, pr) as `activations` lays them out; returns the per-sample scores
    (SCORES_SCHEMA). cfg: pathways.experiments; P(True)'s prompt is built like the answers'."""
    if table.height == 0:
        return pl.DataFrame(schema=SCORES_SCHEMA)
    patch, answer_only, pr = outs
    n, ids = table.height, table["id"].to_list()
    scores = {"id": ids, "layer": [layer] * n}
    seqs = [list(p) + list(a) for p, a in zip(table["prompt_ids"], table["answer_ids"], strict=True)]
    prompt_lens = table["prompt_ids"].list.len().to_list()
    eq, probe = (table[c].to_list() for c in ("eq_positions", "probe_position"))
    controls = zip(table["control_positions"].to_list(), table["control_matched"], strict=True)
    ctrl0 = [c[0] if m and c else None for c, m in controls]
    inputs = patched_inputs(ids, seqs, eq, ctrl0, cfg["patch_seed"])
    patched = [Condition(tokens=inputs["target"]), Condition(tokens=inputs["control"])]
    run(lm, seqs, Resid(probe, layer, list(patch)), batch_size, patched, desc=f"patching {name}")
    bos = lm.tokenizer.bos_token_id
    bos = bos if bos is not None and seqs[0][:1] == [bos] else None
    ao_seqs, ao_pos = answer_only_inputs(seqs, prompt_lens, probe, bos)
    answer_alone = Resid(ao_pos, layer, [answer_only])
    run(lm, ao_seqs, answer_alone, batch_size, [Condition()], desc=f"answer only {name}")
    answer_pos = [list(range(start, p + 1)) for start, p in zip(prompt_lens, probe, strict=True)]
    conds = reweighting(answer_pos, eq, cfg["pr_factors"])
    run(lm, seqs, Resid(probe, layer, list(pr)), batch_size, conds, desc=f"PR {name}")
    kw = {"instruction": "", "chat_template_kwargs": chat_template_kwargs}
    pairs = zip(table["question"], table["answer"], strict=True)
    texts = [P_TRUE_TEMPLATE.format(question=q, answer=a.strip()) for q, a in pairs]
    prompts = [encode_prompt(lm.tokenizer, build_prompt(lm.tokenizer, t, chat, **kw), chat) for t in texts]
    scores.update(
        donor=inputs["donor"],
        donor_length_matched=inputs["length_matched"],
        patch_control_matched=[c is not None for c in ctrl0],
        p_true=p_true(lm, prompts, batch_size, desc=f"P(True) {name}"),
        **{c: table[c] for c in SALIENCY_SCHEMA if c != "id"},  # extract_pathways' saliency pass
    )
    return pl.DataFrame(scores, schema=SCORES_SCHEMA)
