"""Answer labelling (METHOD A2): SQuAD-style normalization, alias containment with its character span,
refusal flags."""

from __future__ import annotations

import re
import string

import polars as pl

ARTICLES = {"a", "an", "the"}
PUNCT = set(string.punctuation) | {"“", "”", "‘", "’", "–", "—", "…", "«", "»"}
REFUSAL_PATTERNS = [
    r"\bi (?:do not|don't|dont) know\b",
    r"\bunknown\b",
    r"\bnot sure\b",
    r"\bi(?: am|'m) sorry\b",
    r"\bcan ?not (?:answer|be determined|provide)\b",
    r"\bcan't (?:answer|be determined|provide)\b",
    r"\bno (?:information|answer)\b",
    r"\bas an ai\b",
    r"\bi (?:have no|lack) (?:idea|information)\b",
    r"\bunable to (?:answer|determine|provide)\b",
]
_REFUSAL = re.compile("|".join(REFUSAL_PATTERNS), re.IGNORECASE)


def normalized_words(text: str) -> list[tuple[str, int, int]]:
    """Words of the normalized text with the [start, end) character span each covers in `text`.
    Normalization: lowercase, punctuation dropped, articles a/an/the dropped, whitespace folded."""
    words: list[tuple[str, int, int]] = []
    cur: list[str] = []
    start = end = -1
    for i, ch in enumerate(text):
        if ch in PUNCT:
            continue  # dropped, does not split a word ("U.S." -> "us")
        if ch.isspace():
            if cur:
                words.append(("".join(cur), start, end))
                cur = []
            continue
        if not cur:
            start = i
        cur.append(ch.lower())
        end = i + 1
    if cur:
        words.append(("".join(cur), start, end))
    return [w for w in words if w[0] not in ARTICLES]


def normalize_text(text: str) -> str:
    return " ".join(w for w, _, _ in normalized_words(text))


def match_alias(answer: str, aliases: list[str]) -> tuple[str, int, int] | None:
    """First gold alias (longest first) whose normalized words occur contiguously in the normalized answer;
    returns (alias, char_start, char_end) in the raw answer."""
    ans_words = normalized_words(answer)
    tokens = [w for w, _, _ in ans_words]
    for alias in sorted(aliases, key=lambda a: -len(normalize_text(a))):
        target = normalize_text(alias).split()
        if not target:
            continue
        n = len(target)
        for i in range(len(tokens) - n + 1):
            if tokens[i : i + n] == target:
                return alias, ans_words[i][1], ans_words[i + n - 1][2]
    return None


def is_refusal(answer: str) -> bool:
    return not answer.strip() or bool(_REFUSAL.search(answer))


def label_frame(answers: pl.DataFrame, questions: pl.DataFrame) -> pl.DataFrame:
    """answers: id, answer, ...; questions: id, answers (gold aliases).
    Adds correct, the matched alias and its span, and the refusal flag."""
    gold = dict(zip(questions["id"].to_list(), questions["answers"].to_list(), strict=True))
    rows = []
    for rec in answers.select("id", "answer").iter_rows(named=True):
        hit = match_alias(rec["answer"], gold[rec["id"]])
        rows.append(
            {
                "id": rec["id"],
                "correct": hit is not None,
                "matched_alias": hit[0] if hit else None,
                "match_start": hit[1] if hit else None,
                "match_end": hit[2] if hit else None,
                "refusal": hit is None and is_refusal(rec["answer"]),
            }
        )
    labels = pl.DataFrame(
        rows,
        schema={
            "id": pl.String,
            "correct": pl.Boolean,
            "matched_alias": pl.String,
            "match_start": pl.Int64,
            "match_end": pl.Int64,
            "refusal": pl.Boolean,
        },
    )
    return answers.join(labels, on="id", how="left")


def accuracy_table(labelled: pl.DataFrame, model: str, dataset: str) -> pl.DataFrame:
    n = labelled.height
    n_correct = int(labelled["correct"].sum()) if n else 0
    return pl.DataFrame(
        {
            "model": [model],
            "dataset": [dataset],
            "n": [n],
            "n_correct": [n_correct],
            "accuracy": [n_correct / n if n else float("nan")],
            "n_refusal": [int(labelled["refusal"].sum()) if n else 0],
        }
    )
