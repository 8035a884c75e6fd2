"""All datasets truthflow knows (QA_SETS); it imports only errors.py, so other edits rerun no download."""

import hashlib
import json
import re
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass

from .errors import TruthflowError

Span = tuple[int, int]


def get_field(rec: dict, key: str):
    """Dotted lookup ('answer.aliases') into nested dicts."""
    for part in key.split("."):
        rec = rec.get(part) if isinstance(rec, dict) else None
    return rec


def as_list(value) -> list[str]:
    """A list of strings from a list, or from a string (a JSON list "[...]" is parsed; else one item)."""
    if value is None:
        return []
    if isinstance(value, str):
        s = value.strip()
        if s.startswith("["):
            with suppress(json.JSONDecodeError):
                return [str(v) for v in json.loads(s)]
        return [s] if s else []
    return [str(v) for v in value]


def dedup(values: list[str]) -> list[str]:
    return list(dict.fromkeys(v.strip() for v in values if v.strip()))


def question_id(name: str, question: str) -> str:
    """Stable id from the question text (lowercased, whitespace folded): '{name}-' + 12 hex of its sha1."""
    key = " ".join(question.lower().split())
    return f"{name}-{hashlib.sha1(key.encode('utf-8')).hexdigest()[:12]}"


@dataclass(frozen=True)
class Hub:
    """Hub defaults: of a source `{hub: <this id>}` without `config`/`split`, or of no `source`."""

    id: str
    config: str | None = None
    split: str = "validation"
    # rows of that config and split, as a run with `n: null` loads them (the bill and the disk plan size runs
    # from it before any download)
    rows: int | None = None


@dataclass(frozen=True)
class QASet:
    name: str
    display: str
    colour: str
    hub: Hub
    # record -> {"question", "answers", <the set's own columns>}; no id (normalize adds it)
    fields: Callable[[dict], dict]
    # columns the source's first record must have (a capitalized one counts: TriviaQA's "Question")
    required: tuple[str, ...] = ("question", "answer")
    # the source's own id fields, first non-blank wins; none: question_id(name, question)
    id_fields: tuple[str, ...] = ("id",)
    # own columns that must be integers (converted after the id is known, so a bad value names the sample)
    int_fields: tuple[str, ...] = ()
    # E_Q rule: (question, {"subj", "prop"}) -> sorted character spans; None (returned or here): generic rule
    question_spans: Callable[[str, dict], list[Span] | None] | None = None
    # a typical prompt's length in tokens (question and base-prompt frame), for the bill's decode pricing
    prompt_tokens: int = 32

    def normalize(self, record: dict, i: int) -> dict:
        """Source record `i` as id, question, answers, own columns (the loader drops blank ones)."""
        row = self.fields(record)
        own = (str(record[f]).strip() for f in self.id_fields if record.get(f) is not None)
        rid = next(filter(None, own), None) or question_id(self.name, row["question"])
        for f in self.int_fields:
            value = row.get(f)
            try:
                row[f] = None if value in (None, "") else int(value)
            except (TypeError, ValueError):
                raise TruthflowError(
                    f"dataset '{self.name}': sample '{rid}' has {f}={str(value)[:60]!r}, not an integer "
                    f"(record {i})"
                ) from None
        return {"id": rid, **row}


# PopQA's property words as its question templates word them (METHOD A4)
POPQA_PROPS = "occupation genre father mother country capital producer director screenwriter composer sport"
POPQA_PROP_WORDS = {prop: [prop] for prop in (*POPQA_PROPS.split(), "religion", "author")}
POPQA_PROP_WORDS |= {"place of birth": ["born"], "capital of": ["capital"], "color": ["color", "colour"]}


def popqa_spans(question: str, row: dict) -> list[Span] | None:
    """PopQA's E_Q: the `subj` string and the template's words for `prop`; None without a subject."""
    subj, prop = row.get("subj"), row.get("prop")
    if not subj:
        return None
    i = question.find(subj) if subj in question else question.lower().find(subj.lower())
    spans: list[Span] = [(i, i + len(subj))] if i >= 0 else []
    for word in POPQA_PROP_WORDS.get((prop or "").lower(), []):
        for m in re.finditer(rf"\b{re.escape(word)}\b", question, re.IGNORECASE):
            if not any(s <= m.start() < e for s, e in spans):
                spans.append((m.start(), m.end()))
    return sorted(spans)


def _popqa(rec: dict) -> dict:
    answers = dedup(as_list(rec.get("possible_answers")))  # a TSV cell holds a JSON list
    own = {k: rec.get(k) for k in ("subj", "prop", "obj", "s_pop")}
    return {"question": str(rec.get("question") or "").strip(), "answers": answers, **own}


def _triviaqa(rec: dict) -> dict:
    ans = rec.get("answer") if rec.get("answer") is not None else rec.get("Answer")
    if isinstance(ans, dict):
        keys = (("aliases", "Aliases"), ("normalized_aliases", "NormalizedAliases"))
        aliases = [a for low, cap in keys for a in as_list(ans.get(low) or ans.get(cap))]
        value = ans.get("value") or ans.get("Value")
    else:  # flat copies: answer = value, aliases in their own column
        aliases = as_list(rec.get("aliases"))
        value = ans
    question = str(rec.get("question") or rec.get("Question") or "").strip()
    # lm-eval style copies wrap it: "Question: ...\nAnswer:"
    question = question.removeprefix("Question:").removesuffix("Answer:").strip()
    return {"question": question, "answers": dedup(as_list(value) + aliases)}


def _nq(rec: dict) -> dict:
    answer = rec.get("answer")  # one answer string (kept whole, never parsed) or a list of them
    answers = dedup([answer] if isinstance(answer, str) else as_list(answer))
    return {"question": str(rec.get("question") or "").strip(), "answers": answers}


def _hotpotqa(rec: dict) -> dict:
    return {**_nq(rec), "type": rec.get("type"), "level": rec.get("level")}


# order = the order of tables, figure legends and the default pathways.datasets; colours: seaborn tab10
QA_SETS: tuple[QASet, ...] = (
    QASet(
        "popqa",
        "PopQA",
        "#1f77b4",
        Hub("akariasai/PopQA", split="test", rows=14_267),
        _popqa,
        required=("question", "possible_answers"),
        int_fields=("s_pop",),
        question_spans=popqa_spans,
        prompt_tokens=24,
    ),
    QASet(
        "triviaqa",
        "TriviaQA",
        "#ff7f0e",
        Hub("mandarjoshi/trivia_qa", "rc.nocontext", rows=17_944),
        _triviaqa,
        id_fields=("question_id", "QuestionId"),
        prompt_tokens=32,
    ),
    QASet(
        "hotpotqa",
        "HotpotQA",
        "#2ca02c",
        Hub("hotpotqa/hotpot_qa", "distractor", rows=7_405),
        _hotpotqa,
        id_fields=("_id", "id"),
        prompt_tokens=40,
    ),
    QASet("nq", "NQ", "#d62728", Hub("google-research-datasets/nq_open", rows=3_610), _nq, prompt_tokens=24),
)

# DepthQA is not a QA set of the pathways analysis: its loader (data.load_depthqa) reads a question graph
DEPTHQA = "depthqa"
DEPTHQA_HUB = Hub("kaist-ai/DepthQA", split="test", rows=1_571)
DEPTHQA_PROMPT_TOKENS = 120  # the answer prompt's system text and instructions around the question

_BY_NAME = {s.name: s for s in QA_SETS}


def qa_names() -> list[str]:
    return [s.name for s in QA_SETS]


def names() -> list[str]:
    """Every dataset name the config accepts under `datasets`."""
    return [*qa_names(), DEPTHQA]


def hub_rows(name: str) -> int:
    """Rows of a dataset's default hub source (what a run with `n: null` loads)."""
    return (DEPTHQA_HUB if name == DEPTHQA else get(name).hub).rows


def prompt_tokens(name: str) -> int:
    """A typical prompt's length in tokens for a dataset (the bill's decode pricing)."""
    return DEPTHQA_PROMPT_TOKENS if name == DEPTHQA else get(name).prompt_tokens


def is_qa(name: str) -> bool:
    return name in _BY_NAME


def get(name: str) -> QASet:
    if name not in _BY_NAME:
        raise TruthflowError(f"unknown QA dataset '{name}' (known: {', '.join(qa_names())})")
    return _BY_NAME[name]


def fill_source(name: str, spec: dict) -> None:
    """Hub defaults into one dataset entry of the config, before the schema's defaults (Hub)."""
    if name == DEPTHQA:
        hub = DEPTHQA_HUB
    elif name in _BY_NAME:
        hub = _BY_NAME[name].hub
    else:
        return
    if spec.get("source") is None:
        spec["source"] = {"hub": hub.id, "config": hub.config, "split": hub.split}
    elif isinstance(spec["source"], dict) and spec["source"].get("hub") == hub.id:
        spec["source"].setdefault("config", hub.config)
        spec["source"].setdefault("split", hub.split)
