"""Exact answer tokens E_A and exact question tokens E_Q (METHOD A3-A4): character spans found by
deterministic extractors (or an LLM extractor), mapped to token positions through the tokenizer's offsets."""

from __future__ import annotations

import re

import numpy as np
import polars as pl

from .. import registry
from ..text import STOPWORDS

WH_WORDS = {"what", "which", "who", "whom", "whose", "when", "where", "why", "how"}
# words that frame a question or an answer without being its subject, property or answer
FRAME_WORDS = {"answer", "question", "called", "named", "known", "type", "kind", "sort", "example", "year"}
NAME_CONNECTORS = {
    "of",
    "the",
    "de",
    "da",
    "di",
    "del",
    "der",
    "van",
    "von",
    "du",
    "la",
    "le",
    "y",
    "for",
    "on",
}
ABBREVIATIONS = {
    "dr",
    "mr",
    "mrs",
    "ms",
    "st",
    "jr",
    "sr",
    "mt",
    "ft",
    "no",
    "vs",
    "gen",
    "col",
    "lt",
    "sgt",
    "capt",
}
# titles that precede a name: an entity run keeps the name after them
TITLE_WORDS = {
    "king",
    "queen",
    "emperor",
    "empress",
    "prince",
    "princess",
    "president",
    "saint",
    "sir",
    "lord",
    "lady",
    "pope",
    "pharaoh",
    "sultan",
    "tsar",
    "czar",
    "duke",
    "duchess",
    "dr",
    "professor",
}
MAX_EA_WORDS = 4  # an entity or number run longer than this is cut to its first MAX_EA_WORDS words
MAX_EA_PHRASE = 3  # a lowercase answer phrase longer than this is cut to its first MAX_EA_PHRASE words

_WORD = re.compile(r"(?<![\w-])-?\d+(?:,\d{3})*(?:\.\d+)?(?:st|nd|rd|th|s)?|[^\W_](?:[\w'’\-]|\.(?=[^\W_]))*")
_LEADING = re.compile(
    r"^(?:(?:the\s+)?(?:correct\s+|short\s+)?answer\s*(?:is|:)\s*:?|a:|it\s+(?:is|was)|it's|that\s+(?:is|was)|"
    r"that's|he\s+(?:is|was)|she\s+(?:is|was)|they\s+(?:are|were)|this\s+is|i\s+think\s+(?:it\s+is|it's)?)\s+",
    re.IGNORECASE,
)
# leading phrases that carry no answer; stripped repeatedly ("The answer to this question is: The answer is:")
_LEADING_ANY = re.compile(
    r"^(?:(?:[\w'’]+\s+)?(?:final\s+|correct\s+|short\s+|right\s+)?answer(?:\s+to\s+(?:this|the|your)\s+question)?"
    r"\s*(?:is|was|would\s+be|:)\s*:?|(?:q|a|answer|response)\s*:|[A-Za-z]+\s*:(?=\s)|"
    r"i\s+(?:think|believe|guess)(?:\s+that)?(?:\s+(?:it\s+is|it's|it\s+was))?|it\s+(?:is|was)|it's|"
    r"that\s+(?:is|was)|that's|(?:he|she)\s+(?:is|was)|they\s+(?:are|were)|this\s+is|"
    r"(?:sure|well|okay|ok|so)\s*,)\s*",
    re.IGNORECASE,
)
_COPULA = re.compile(r"\s(?:is|was|are|were)\s", re.IGNORECASE)
_CLAUSE_BREAK = re.compile(
    r"\s*(?:[,;:(]|\s-\s|\s(?:that|which|who|whom|whose|where|when|because|while|but|although)\s)",
    re.IGNORECASE,
)
_QUOTED = re.compile(r"\"([^\"]+)\"|“([^”]+)”")


def _overlap_tokens(offsets: list[tuple[int, int]], start: int, end: int) -> list[int]:
    return [i for i, (s, e) in enumerate(offsets) if e > start and s < end and e > s]


def _norm(word: str) -> str:
    return re.sub(r"[^\w]", "", word.lower())


def _stem(word: str) -> str:
    """A crude stem for matching answer words with question words: lowercase, possessive and one common
    suffix (-ing, -ed, -es, -er, -s) dropped ("composed" ~ "composer", "seasons" ~ "season")."""
    w = _norm(word)
    w = w[:-1] if w.endswith("s") and w[-2:-1] in "'’" else w
    for suf in ("ing", "ed", "es", "er", "s"):
        if len(w) > len(suf) + 3 and w.endswith(suf):
            return w[: -len(suf)]
    return w


def _is_stop(word: str) -> bool:
    w = _norm(word)
    base = re.split(r"['’]", word.lower())[0]
    return w in STOPWORDS or word.lower() in STOPWORDS or ("'" in word or "’" in word) and base in STOPWORDS


def _words(text: str, start: int = 0, end: int | None = None) -> list[tuple[str, int, int]]:
    return [
        (m.group(0), m.start(), m.end())
        for m in _WORD.finditer(text, start, len(text) if end is None else end)
    ]


def _shouted(word: str) -> bool:
    """A word in capitals throughout, three letters or more ("BROWN"; not "II", "J.R.R" or "US")."""
    letters = [c for c in word if c.isalpha()]
    return len(letters) >= 3 and all(c.isupper() for c in letters)


def _head(run: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """The head of a lowercase answer phrase: its last word, as English noun phrases end in their head
    ("a professional skier" -> "skier", "a magical creature" -> "creature"); a phrase joined by a connector
    ("god of war") is kept whole, its head being before the connector. The head ends where the phrase ends,
    so the probe's position (the last E_A token) does not move."""
    if any(w.lower() in NAME_CONNECTORS for w, _, _ in run):
        return run
    return run[-1:]


def _is_cap(word: str) -> bool:
    """Capitalized or a number."""
    return word[:1].isupper() or word.lstrip("-")[:1].isdigit()


def _sentence_end(text: str) -> int:
    """End of the first sentence: the first . ! ? ; followed by a space or the end, not after an initial
    ("John F. Kennedy") or a common abbreviation ("Dr.")."""
    for m in re.finditer(r"[.!?;](?=\s|$)", text):
        if m.group(0) == ".":
            prev = re.search(r"([\w']+)$", text[: m.start()])
            if prev and (re.fullmatch(r"[A-Z]", prev.group(1)) or prev.group(1).lower() in ABBREVIATIONS):
                continue
        return m.start()
    return len(text)


def _runs(text: str, words: list[tuple[str, int, int]], keep) -> list[list[tuple[str, int, int]]]:
    """Maximal runs of words for which keep(i) holds, joined only by spaces (or '. ' after an initial)
    and by name connectors ("of", "de", ...) that stand between two kept words."""
    runs: list[list[tuple[str, int, int]]] = []
    cur: list[tuple[str, int, int]] = []
    i = 0
    while i < len(words):
        w, s, e = words[i]
        if keep(i):
            if cur:
                gap = text[cur[-1][2] : s]
                initial = re.fullmatch(r"[A-Z]|[A-Za-z]\.[A-Za-z.]*", cur[-1][0]) is not None
                if not (gap.strip() in {"", "-", "&"} or (gap.strip() == "." and initial)):
                    runs.append(cur)
                    cur = []
            cur.append(words[i])
        elif cur and w.lower() in NAME_CONNECTORS:
            # connectors ("de la", "of the") join two kept words when only spaces lie between them
            j = i
            while j < len(words) and words[j][0].lower() in NAME_CONNECTORS and not keep(j):
                j += 1
            seq = [cur[-1], *words[i:j], *(words[j : j + 1] if j < len(words) else [])]
            spaced = all(text[a[2] : b[1]].strip() == "" for a, b in zip(seq, seq[1:], strict=False))
            if j < len(words) and keep(j) and spaced:
                cur.extend(words[i:j])
                i = j
                continue
            runs.append(cur)
            cur = []
        elif cur:
            runs.append(cur)
            cur = []
        i += 1
    if cur:
        runs.append(cur)
    return runs


def short_answer_span(
    answer: str, question: str | None = None, max_words: int = MAX_EA_WORDS
) -> tuple[int, int] | None:
    """Deterministic E_A for a wrong answer (METHOD A3): the entity or short phrase that answers, so that
    |E_A| is comparable with the matched alias span of correct answers. Returns the [start, end) span in
    `answer` (the stripped generation), or None when nothing is left.

    The rule, in plain words:
    1. Take the first line; strip leading phrases that carry no answer, repeatedly ("The answer is:",
       "Answer:", "Singer:", "I think", "It is", "Sure,"); keep the first sentence (a period after an
       initial or an abbreviation such as "Dr." does not end it).
    2. An answer that starts with "yes" or "no" is answered by that word.
    3. Question words are words whose crude stem (-s, -es, -ed, -er, -ing and possessives dropped) occurs in
       the question; stop words are articles, prepositions, pronouns, auxiliaries and wh-words. Without a
       question, a copula clause is dropped first ("The capital of France is Paris" -> "Paris").
    4. The answer is the first named thing that is not copied from the question: a quoted span, or a run of
       capitalized words or numbers ("Franz Liszt", "1912", "Leonardo da Vinci"), with leading and trailing
       stop words removed and question words cut out ("The Moonlight Sonata was written by Franz Liszt" ->
       "Franz Liszt"); at most `max_words` (default MAX_EA_WORDS = 4) words, the first ones. Titles before
       a name are dropped ("the Roman Emperor Claudius" -> "Claudius"; "Queen of England" stays), as gold
       aliases name people without them. A named thing that directly follows a lowercase relation word
       restated from the question (only stop words between) is preferred to an earlier one ("Mohsakal
       Advani was born in India" for "In what city was Mahatma Gandhi born?" -> "India"). A run in capitals
       throughout (each word three letters or more) is shouted, not a name, and keeps its last word.
    5. Else, in the first clause (cut at a comma, colon, semicolon, bracket, dash or a relative word such as
       "that", "which", "who", "because"), the first run of content words that are neither stop words, frame
       words ("answer", "type", "called", ...) nor question words, at most MAX_EA_PHRASE words, then its
       head, the last word ("a professional skier" -> "skier"; "god of war" with its connector stays; "It
       is a type of vegetable" -> "vegetable").
    6. Else (the answer only restates the question) the first capitalized run even if it is copied from the
       question ("Mars is larger than Jupiter" -> "Mars"), else the last non-stop word of the sentence, else
       the last word."""
    line_end = answer.find("\n")
    line = answer if line_end < 0 else answer[:line_end]
    start = len(line) - len(line.lstrip())
    while True:
        m = _LEADING_ANY.match(line, start)
        if not m or m.end() == start or not line[m.end() :].strip():
            break
        start = m.end()
    end = start + _sentence_end(line[start:])
    words = _words(line, start, end)
    if not words:
        return None
    if _norm(words[0][0]) in {"yes", "no"}:
        return words[0][1], words[0][2]
    if question is None:
        c = _COPULA.search(line, start, end)
        if c and len(line[start : c.start()].split()) >= 2 and line[c.end() : end].strip(" .,;:!?\"'"):
            start = c.end()
            words = _words(line, start, end)
    qstems = {_stem(w) for w, _, _ in _words(question)} if question else set()

    def is_q(w: str) -> bool:
        return _stem(w) in qstems

    def span_of(run: list[tuple[str, int, int]], limit: int) -> tuple[int, int]:
        run = run[:limit]
        while run and run[-1][0].lower() in NAME_CONNECTORS:
            run = run[:-1]
        return run[0][1], run[-1][2]

    def trimmed(run):
        while run and (_is_stop(run[0][0]) or run[0][0].lower() in NAME_CONNECTORS):
            run = run[1:]
        while run and (_is_stop(run[-1][0]) or run[-1][0].lower() in NAME_CONNECTORS):
            run = run[:-1]
        return run

    candidates: list[tuple[int, int]] = []
    for m in _QUOTED.finditer(line, start, end):
        g = 1 if m.group(1) is not None else 2
        inner = _words(line, m.start(g), m.end(g))
        if inner and not all(is_q(w) or _is_stop(w) for w, _, _ in inner):
            candidates.append(span_of(inner, max_words))

    def entity(i: int) -> bool:
        w = words[i][0]
        return _is_cap(w) and not _is_stop(w) and _norm(w) not in FRAME_WORDS

    def untitled(run):
        # "Roman Emperor Claudius Blackwood" -> "Claudius Blackwood", "King Louis XF" -> "Louis XF": leading
        # words up to the last title are dropped when a name follows the title directly ("Queen of England"
        # keeps its title); gold aliases name people without their titles
        last = max((k for k, (w, _, _) in enumerate(run) if _norm(w) in TITLE_WORDS), default=-1)
        named = 0 <= last < len(run) - 1 and _is_cap(run[last + 1][0])
        if named and run[last + 1][0].lower() not in NAME_CONNECTORS:
            return run[last + 1 :]
        return run

    def unshouted(run):
        # "BROWN BARBADO OPERA" -> "OPERA": a run of words in capitals throughout (three letters or more
        # each, so initials, numerals such as "XIV" and short acronyms are not shouting) is shouted text,
        # not a name; capitals split into many sub-word tokens (SmolLM2: 11 tokens for these 3 words), so it
        # keeps its last word, which ends where the run ends (the probe's position does not move)
        if len(run) >= 2 and all(_shouted(w) for w, _, _ in run):
            return run[-1:]
        return run

    anchored: list[tuple[int, int]] = []
    index = {s_: k for k, (_, s_, _) in enumerate(words)}
    for run in _runs(line, words, entity):
        run = unshouted(untitled(trimmed(run)))
        if run and not all(is_q(w) for w, _, _ in run):
            span = span_of(run, max_words)
            candidates.append(span)
            # anchored: the nearest word before the run that is not a stop word is a relation word restated
            # from the question ("... was born in India" for "In what city was ... born?")
            k = index[run[0][1]] - 1
            while k >= 0 and _is_stop(words[k][0]):
                k -= 1
            prev = words[k][0] if k >= 0 else ""
            if prev[:1].islower() and is_q(prev) and _has_letter(run[0][0]):
                anchored.append(span)
    if candidates:
        return min(anchored or candidates)
    # 5. a lowercase phrase in the first clause
    cb = _CLAUSE_BREAK.search(line, words[0][2], end)
    clause_end = cb.start() if cb else end
    for lo, hi in ((start, clause_end), (start, end)):
        cw = _words(line, lo, hi)

        def content(i: int, cw=cw) -> bool:
            w = cw[i][0]
            return not _is_stop(w) and not is_q(w) and _norm(w) not in FRAME_WORDS and len(_norm(w)) > 1

        runs = [r for r in _runs(line, cw, content) if trimmed(r)]
        if runs:
            return span_of(_head(trimmed(runs[0])[:MAX_EA_PHRASE]), MAX_EA_PHRASE)
    # 6. only a restatement of the question
    caps = [
        trimmed(r) for r in _runs(line, words, lambda i: _is_cap(words[i][0]) and not _is_stop(words[i][0]))
    ]
    caps = [r for r in caps if r]
    if caps:
        return span_of(caps[0], max_words)
    rest = [w for w in words if not _is_stop(w[0])] or words
    return rest[-1][1], rest[-1][2]


MAX_SUBJECT_WORDS = 3  # a longer subject chunk keeps its last (head) words
CHUNK_BRIDGES = {"of", "and", "the", "&", "de"}
# relation verbs: content words, but each forms a chunk of its own ("who played | big enos")
RELATION_VERBS = set(
    """sang sing sings sung wrote write writes written played starred made make makes invented invent
invents discovered discover directed produced founded built build designed painted composed compose won
lost died born come came comes went got become became becomes said says means happened happens took taken
gave given lived started ended began begins released voiced sank sunk created create killed invaded ruled
led owned coined introduced""".split()
)


def _content_mask(words: list[tuple[str, int, int]]) -> list[bool]:
    """Content words: not stop words (wh-words, auxiliaries, pronouns, prepositions, ...), not frame words,
    not single letters; numbers count."""
    out = []
    for w, _, _ in words:
        n = _norm(w)
        out.append(not (_is_stop(w) or n in FRAME_WORDS or (len(n) < 2 and not n.isdigit())))
    return out


def _chunks(words: list[tuple[str, int, int]], content: list[bool]) -> list[list[int]]:
    """Runs of content words, bridged by "of", "and", "the", "&", "de" when a content word follows them
    ("pride and prejudice", "season 2 of the crown"); each chunk lists the indices of its content words."""
    chunks: list[list[int]] = []
    cur: list[int] = []
    i = 0
    while i < len(words):
        if content[i] and _norm(words[i][0]) in RELATION_VERBS:
            if cur:
                chunks.append(cur)
            chunks.append([i])
            cur = []
            i += 1
            continue
        if content[i]:
            cur.append(i)
            i += 1
            continue
        j = i
        while j < len(words) and not content[j] and words[j][0].lower() in CHUNK_BRIDGES:
            j += 1
        if cur and i < j < len(words) and content[j]:
            i = j
            continue
        if cur:
            chunks.append(cur)
            cur = []
        i += 1
    if cur:
        chunks.append(cur)
    return chunks


def _has_letter(text: str) -> bool:
    return re.search(r"[^\W\d_]", text) is not None


def subject_property_spans(question: str) -> list[tuple[int, int]]:
    """E_Q of a question without usable capitals: subject chunk + property word + numbers (the rule is
    spelled out in question_spans)."""
    words = _words(question)
    chunks = _chunks(words, _content_mask(words))
    if not chunks:
        return []
    subject = max(reversed(chunks), key=lambda c: (len(c), sum(_has_letter(words[i][0]) for i in c)))
    lettered = [i for c in chunks for i in c if _has_letter(words[i][0])]
    picked = set(subject[-MAX_SUBJECT_WORDS:]) | set(lettered[:1])  # the property: first content word
    picked |= {i for c in chunks for i in c if not _has_letter(words[i][0])}  # every number
    return [(words[i][1], words[i][2]) for i in sorted(picked)]


def question_spans(
    question: str, dataset: str, subj: str | None = None, prop: str | None = None, row: dict | None = None
) -> list[tuple[int, int]]:
    """Deterministic E_Q (METHOD A4): the question's subject and property words. Returns sorted [start, end)
    character spans in `question`. `row`: the sample's other columns, for a set's own rule.

    The rule, in plain words:
    - A set with its own rule in registry.py (PopQA: the `subj` string, plus the property words of the
      question template for `prop`; registry.popqa_spans).
    - A question with capitals past its first word (TriviaQA, HotpotQA): quoted spans, capitalized runs
      (with connectors inside, "Statue of Liberty"; a sentence-initial wh-word or stop word dropped) and
      numbers, provided one of them is not a number.
    - Otherwise (every NQ-open question is lowercase, so capitals cannot mark its names; also a mixed-case
      question whose only named spans are numbers, or with no capitals past its first word): content words
      are the words that are not wh-words, auxiliaries, pronouns, prepositions or other stop words, not
      frame words ("called", "named", "type", "year", ...) and not single letters; numbers count.
      Consecutive content words form chunks, bridged by "of", "and", "the", "&", "de" ("pride and
      prejudice", "season 2 of the crown"); a relation verb ("sang", "wrote", "played", "won", ... in
      RELATION_VERBS) is a chunk of its own. E_Q is
        the subject: the longest chunk (most content words; ties: more non-numeric words, then the later
        chunk), cut to its last MAX_SUBJECT_WORDS (head) words;
        the property: the question's first non-numeric content word (usually the relation or the asked
        attribute: "sang", "episodes");
        every number in the question (kept, never alone: the property is a word).
      Examples: "who sang i will always love you" -> "sang", "always", "love"; "when did the eagles win
      their last super bowl" -> "eagles", "super", "bowl"; "how many episodes in season 2 of the crown" ->
      "episodes", "season", "2", "crown"; "what year did the titanic sink" -> "titanic", "sink".
      On the 3,610 NQ-open dev questions every E_Q has a non-numeric word and E_Q is a median 40% (SmolLM2
      tokenizer) / 37.5% (Gemma-3) of the question's tokens."""
    spans: list[tuple[int, int]] = []
    own_rule = registry.get(dataset).question_spans if registry.is_qa(dataset) else None
    if own_rule is not None:  # the set's own E_Q rule (registry.py); None where it does not apply
        own = own_rule(question, {**(row or {}), "subj": subj, "prop": prop})
        if own is not None:
            return own
    words = _words(question)
    lowercase = not any(_is_cap(w) and not w.isdigit() and w != "I" for w, _, _ in words[1:])
    if not lowercase:
        spans = _named_spans(question)
        if any(_has_letter(question[s:e]) for s, e in spans):
            return sorted(spans)
    picked = subject_property_spans(question)
    return sorted(set(picked) | {sp for sp in spans if not any(a < sp[1] and sp[0] < b for a, b in picked)})


def _named_spans(question: str) -> list[tuple[int, int]]:
    """Quoted spans, capitalized runs and numbers of a mixed-case question."""
    spans: list[tuple[int, int]] = []
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
    return spans


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


def ea_token_count(tokenizer, answer_ids: list[int], span: tuple[int, int] | None) -> int:
    """|E_A| in tokens: the generated tokens that overlap `span` (a span in the stripped answer), mapped
    exactly as `locate` maps it; 0 when the span is None or covers no token."""
    if span is None:
        return 0
    raw, offsets = answer_token_offsets(tokenizer, answer_ids)
    lead = len(raw) - len(raw.lstrip())
    return len(_overlap_tokens(offsets, span[0] + lead, span[1] + lead))


def ea_length_table(
    tokenizer, labelled, questions=None, use_question: bool = True, max_words: int = MAX_EA_WORDS
):
    """Mean |E_A| in tokens per class for one (model, dataset): `labelled` has answer, answer_ids, correct,
    match_start, match_end (a labels parquet); `questions` (id, question) gives the question text to the
    wrong-answer extractor. Returns a one-row polars frame: n and mean |E_A| for correct and wrong answers,
    their ratio (wrong / correct), and the number of wrong answers whose E_A was not found."""
    import polars as pl

    qtext = dict(zip(questions["id"], questions["question"], strict=True)) if questions is not None else {}
    sizes: dict[bool, list[int]] = {True: [], False: []}
    missing = 0
    for r in labelled.iter_rows(named=True):
        if r["correct"]:
            span = (r["match_start"], r["match_end"])
        else:
            span = short_answer_span(r["answer"], qtext.get(r["id"]) if use_question else None, max_words)
        n = ea_token_count(tokenizer, r["answer_ids"], span)
        if n == 0:
            missing += not r["correct"]
            continue
        sizes[bool(r["correct"])].append(n)

    def mean(x: list[int]) -> float:
        return sum(x) / len(x) if x else float("nan")

    mc, mw = mean(sizes[True]), mean(sizes[False])
    return pl.DataFrame(
        {
            "n_correct": [len(sizes[True])],
            "n_wrong": [len(sizes[False])],
            "mean_ea_correct": [mc],
            "mean_ea_wrong": [mw],
            "ratio": [mw / mc if sizes[True] and sizes[False] else float("nan")],
            "n_wrong_ea_missing": [missing],
        }
    )


CLASS_TABLE_SCHEMA = {
    "model": pl.String,
    "dataset": pl.String,
    "class": pl.String,
    "n": pl.UInt32,
    "mean_ea_tokens": pl.Float64,
    "mean_eq_tokens": pl.Float64,
    "median_eq_share": pl.Float64,
    "n_no_matched_control": pl.UInt32,
    "auc_ea_length_only": pl.Float64,
    "auc_position_only": pl.Float64,
}


def position_only_auc(correct: np.ndarray, value: np.ndarray) -> float:
    """How well a position feature alone separates the classes: the ROC AUC of `value` for 'wrong' (the
    larger value, the more likely wrong), folded to >= 0.5 (a feature that separates the other way counts
    as well), so 0.5 means no separation and 1.0 a perfect one. NaN with one class only. Ties count 1/2."""
    correct = np.asarray(correct, dtype=bool)
    value = np.asarray(value, dtype=float)
    wrong, right = value[~correct], value[correct]
    if not len(wrong) or not len(right):
        return float("nan")
    greater = (wrong[:, None] > right[None, :]).sum() + 0.5 * (wrong[:, None] == right[None, :]).sum()
    auc = float(greater / (len(wrong) * len(right)))
    return max(auc, 1.0 - auc)


def class_table(samples: pl.DataFrame, model: str, dataset: str) -> pl.DataFrame:
    """Per answer class of one (model, dataset): n, mean |E_A| and |E_Q| in tokens, the median E_Q share of
    the question tokens, the samples without a matched random control, and the position confound check
    (A3): how well |E_A| alone, and the probe position alone, separate correct from wrong answers (AUC
    folded to >= 0.5; the same value on both class rows). A probe AUC not clearly above these could be
    reading position, not truthfulness."""
    correct = samples["correct"].to_numpy()
    auc_len = position_only_auc(correct, samples["n_ea"].to_numpy())
    auc_pos = position_only_auc(correct, samples["probe_position"].to_numpy())
    return (
        samples.group_by(
            pl.when(pl.col("correct")).then(pl.lit("correct")).otherwise(pl.lit("wrong")).alias("class")
        )
        .agg(
            pl.len().alias("n"),
            pl.col("n_ea").mean().round(2).alias("mean_ea_tokens"),
            pl.col("n_eq").mean().round(2).alias("mean_eq_tokens"),
            (pl.col("n_eq") / pl.col("question_positions").list.len())
            .median()
            .round(3)
            .alias("median_eq_share"),
            (~pl.col("control_matched")).sum().alias("n_no_matched_control"),
        )
        .select(
            pl.lit(model).alias("model"),
            pl.lit(dataset).alias("dataset"),
            pl.all(),
            pl.lit(round(auc_len, 3)).alias("auc_ea_length_only"),
            pl.lit(round(auc_pos, 3)).alias("auc_position_only"),
        )
        .cast(CLASS_TABLE_SCHEMA)
        .sort("class")
    )
