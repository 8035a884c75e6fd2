"""Text normalization shared by the stages: stop words, and the normalized words that answer matching
(pathways labels) and the judge's exact-match shortcut (depth) both compare."""

from __future__ import annotations

import string

STOPWORDS = set(
    """a an the of in on at to for from by with about as into like through after over between out
against during without before under around among is are was were be been being am do does did has have had
what which who whom whose when where why how that this these those it its it's he she they them his her their
there here and or but if then than so not no nor too very can will just should would could may
might must shall
name named called one first last many much most more some any each other another same such own only also
does did doing done i you we us our your my me""".split()
)

ARTICLES = {"a", "an", "the"}
PUNCT = set(string.punctuation) | {"“", "”", "‘", "’", "–", "—", "…", "«", "»"}

Word = tuple[str, int, int]


def normalized_words(text: str) -> list[Word]:
    """Words of the normalized text with the [start, end) character span each covers in `text`.
    Normalization: lowercase, punctuation dropped, articles a/an/the dropped, whitespace folded."""
    words: list[Word] = []
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
