"""Exact answer tokens E_A and exact question tokens E_Q (METHOD A3-A4): character spans found by
deterministic extractors (or an LLM extractor), mapped to token positions through the tokenizer's offsets."""

from __future__ import annotations

import re

STOPWORDS = set(
    """a an the of in on at to for from by with about as into like through after over between out
against during without before under around among is are was were be been being am do does did has have had
what which who whom whose when where why how that this these those it its it's he she they them his her their
there here and or but if then than so not no nor too very can will just should would could may
might must shall
name named called one first last many much most more some any each other another same such own only also
does did doing done i you we us our your my me""".split()
)

# PopQA property words as they appear in its question templates (METHOD A4)
POPQA_PROP_WORDS = {
    "occupation": ["occupation"],
    "place of birth": ["born"],
    "genre": ["genre"],
    "father": ["father"],
    "country": ["country"],
    "producer": ["producer"],
    "director": ["director"],
    "capital of": ["capital"],
    "screenwriter": ["screenwriter"],
    "composer": ["composer"],
    "color": ["color", "colour"],
    "religion": ["religion"],
    "sport": ["sport"],
    "author": ["author"],
    "mother": ["mother"],
    "capital": ["capital"],
}
_LEADING = re.compile(
    r"^(?:(?:the\s+)?(?:correct\s+|short\s+)?answer\s*(?:is|:)\s*:?|a:|it\s+(?:is|was)|it's|that\s+(?:is|was)|"
    r"that's|he\s+(?:is|was)|she\s+(?:is|was)|they\s+(?:are|were)|this\s+is|i\s+think\s+(?:it\s+is|it's)?)\s+",
    re.IGNORECASE,
)
_COPULA = re.compile(r"\s(?:is|was|are|were)\s", re.IGNORECASE)


def _overlap_tokens(offsets: list[tuple[int, int]], start: int, end: int) -> list[int]:
    return [i for i, (s, e) in enumerate(offsets) if e > start and s < end and e > s]


def short_answer_span(answer: str) -> tuple[int, int] | None:
    """Deterministic E_A for a wrong answer: first line, leading copula phrase removed, first clause,
    trailing punctuation dropped. Returns the [start, end) span in `answer`."""
    line_end = answer.find("\n")
    line = answer if line_end < 0 else answer[:line_end]
    start = len(line) - len(line.lstrip())
    text = line[start:]
    m = _LEADING.match(text)
    if m:
        start += m.end()
        text = line[start:]
    else:
        c = _COPULA.search(text)
        if c and len(text[: c.start()].split()) >= 2 and text[c.end() :].strip():
            start += c.end()
            text = line[start:]
    cut = re.search(r"[.;!?](?:\s|$)|,\s", text)
    if cut:
        text = text[: cut.start()]
    text = text.rstrip(" .,;:!?\"'")
    lead = len(text) - len(text.lstrip(" \"'"))
    start += lead
    text = text.strip(" \"'")
    if not text:
        return None
    return start, start + len(text)


def question_spans(
    question: str, dataset: str, subj: str | None = None, prop: str | None = None
) -> list[tuple[int, int]]:
    """Deterministic E_Q: PopQA subject + template property words; others capitalized multi-word spans,
    quoted spans and numbers, else the content words."""
    spans: list[tuple[int, int]] = []
    if dataset == "popqa" and subj:
        i = question.find(subj)
        if i < 0:
            i = question.lower().find(subj.lower())
        if i >= 0:
            spans.append((i, i + len(subj)))
        for word in POPQA_PROP_WORDS.get((prop or "").lower(), []):
            for m in re.finditer(rf"\b{re.escape(word)}\b", question, re.IGNORECASE):
                if not any(s <= m.start() < e for s, e in spans):
                    spans.append((m.start(), m.end()))
        return sorted(spans)
    for m in re.finditer(r"\"([^\"]+)\"|“([^”]+)”", question):
        g = 1 if m.group(1) else 2
        spans.append((m.start(g), m.end(g)))
    # capitalized runs, allowing lowercase connectors inside ("Statue of Liberty"); skip the sentence start
    connector = r"(?:of(?:\s+the)?|de|la|le|von|van|der|du|da|del|di)"
    cap = r"[A-Z][\w'\-\.]*"
    for m in re.finditer(rf"\b{cap}(?:\s+(?:{connector}\s+)?{cap})*", question):
        s, e = m.start(), m.end()
        words = m.group(0).split()
        if s == 0 or question[:s].strip() == "":
            if words[0].lower() in STOPWORDS:
                if len(words) == 1:
                    continue
                s += len(words[0]) + 1
                while question[s] == " ":
                    s += 1
        if not any(a <= s < b for a, b in spans):
            spans.append((s, e))
    for m in re.finditer(r"\b\d[\d,]*(?:\.\d+)?\b", question):
        if not any(a <= m.start() < b for a, b in spans):
            spans.append((m.start(), m.end()))
    if not spans:
        for m in re.finditer(r"[A-Za-z][\w'\-]*", question):
            if m.group(0).lower() not in STOPWORDS and len(m.group(0)) > 1:
                spans.append((m.start(), m.end()))
    return sorted(spans)


def answer_token_offsets(tokenizer, answer_ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """Character offsets of each generated token inside decode(answer_ids), by incremental decoding."""
    offsets, prev = [], 0
    text = ""
    for i in range(len(answer_ids)):
        text = tokenizer.decode(answer_ids[: i + 1], skip_special_tokens=True)
        cur = len(text)
        offsets.append((prev, max(prev, cur)))
        prev = max(prev, cur)
    return text, offsets


def locate(
    tokenizer,
    prompt: str,
    prompt_ids: list[int],
    chat: bool,
    question: str,
    eq_spans: list[tuple[int, int]],
    answer_ids: list[int],
    ea_span_stripped: tuple[int, int] | None,
) -> tuple[list[int], list[int], list[int], str | None]:
    """Map E_Q (question char spans) and E_A (span in the stripped answer) to positions in
    prompt_ids + answer_ids. Returns (eq_positions, ea_positions, question_positions, drop_reason)."""
    enc = tokenizer(prompt, add_special_tokens=not chat, return_offsets_mapping=True)
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    if list(enc["input_ids"]) != list(prompt_ids):
        return [], [], [], "prompt_retokenization_mismatch"
    q0 = prompt.rfind(question)
    if q0 < 0:
        return [], [], [], "question_not_in_prompt"
    question_pos = _overlap_tokens(offsets, q0, q0 + len(question))
    eq: set[int] = set()
    for s, e in eq_spans:
        eq.update(_overlap_tokens(offsets, q0 + s, q0 + e))
    if not eq:
        return [], [], question_pos, "eq_not_found"
    if ea_span_stripped is None:
        return sorted(eq), [], question_pos, "ea_not_found"
    raw, a_offsets = answer_token_offsets(tokenizer, answer_ids)
    lead = len(raw) - len(raw.lstrip())
    ea_tok = _overlap_tokens(a_offsets, ea_span_stripped[0] + lead, ea_span_stripped[1] + lead)
    if not ea_tok:
        return sorted(eq), [], question_pos, "ea_not_found"
    base = len(prompt_ids)
    return sorted(eq), [base + i for i in ea_tok], question_pos, None
