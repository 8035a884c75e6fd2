"""Exact answer and question tokens E_A, E_Q (METHOD A3-A4): extracted char spans, mapped by token offsets."""

import re
import sys
from itertools import accumulate, chain, pairwise

import numpy as np
import polars as pl

from .. import registry
from ..text import NAME_CONNECTORS, STOPWORDS, Word
from .probes import roc_auc

# words that frame a question or an answer without being its subject, property or answer
FRAME_WORDS = set("answer question called named known type kind sort example year".split())
ABBREVIATIONS = set("dr mr mrs ms st jr sr mt ft no vs gen col lt sgt capt".split())
# titles that precede a name: an entity run keeps the name after them
TITLE_WORDS = set("king queen emperor empress prince princess president saint sir lord lady pope".split())
TITLE_WORDS |= set("pharaoh sultan tsar czar duke duchess dr professor".split())
MAX_EA_WORDS = 4  # an entity or number run longer than this is cut to its first MAX_EA_WORDS words
MAX_EA_PHRASE = 3  # a lowercase answer phrase longer than this is cut to its first MAX_EA_PHRASE words
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

_WORD = re.compile(r"(?<![\w-])-?\d+(?:,\d{3})*(?:\.\d+)?(?:st|nd|rd|th|s)?|[^\W_](?:[\w'’\-]|\.(?=[^\W_]))*")
# leading phrases that carry no answer; stripped repeatedly ("The answer to this question is: The answer is:")
_LEADING_ANY = re.compile(
    r"(?i)^(?:(?:[\w'’]+\s+)?(?:final\s+|correct\s+|short\s+|right\s+)?answer"
    r"(?:\s+to\s+(?:this|the|your)\s+question)?\s*(?:is|was|would\s+be|:)\s*:?|(?:q|a|answer|response)\s*:|"
    r"[A-Za-z]+\s*:(?=\s)|i\s+(?:think|believe|guess)(?:\s+that)?(?:\s+(?:it\s+is|it's|it\s+was))?|"
    r"it\s+(?:is|was)|it's|that\s+(?:is|was)|that's|(?:he|she)\s+(?:is|was)|they\s+(?:are|were)|this\s+is|"
    r"(?:sure|well|okay|ok|so)\s*,)\s*"
)
_CLAUSE_BREAK = re.compile(
    r"(?i)\s*(?:[,;:(]|\s-\s|\s(?:that|which|who|whom|whose|where|when|because|while|but|although)\s)"
)
_QUOTED = re.compile(r"\"([^\"]+)\"|“([^”]+)”")
_INITIAL = re.compile(r"[A-Z]|[A-Za-z]\.[A-Za-z.]*")


def _overlap_tokens(offsets: list[tuple[int, int]], start: int, end: int) -> list[int]:
    return [i for i, (s, e) in enumerate(offsets) if e > start and s < end and e > s]


def _norm(word: str) -> str:
    return re.sub(r"[^\w]", "", word.lower())


def _stem(word: str) -> str:
    """A crude stem to match answer with question words: -ing, -ed, -es, -er or -s dropped ("composed")."""
    w = _norm(word)
    for suf in ("ing", "ed", "es", "er", "s"):
        if len(w) > len(suf) + 3 and w.endswith(suf):
            return w[: -len(suf)]
    return w


def _is_stop(word: str) -> bool:
    # "it's" and "they'd" are stop words by their part before the apostrophe
    return _norm(word) in STOPWORDS or re.split(r"['’]", word.lower())[0] in STOPWORDS


def _is_content(word: str) -> bool:
    """Not a stop word (wh-words, auxiliaries, pronouns, ...), frame word or single letter; digits count."""
    n = _norm(word)
    return not (_is_stop(word) or n in FRAME_WORDS or (len(n) < 2 and not n.isdigit()))


def _words(text: str, start: int = 0, end: int = sys.maxsize) -> list[Word]:
    return [(m.group(0), m.start(), m.end()) for m in _WORD.finditer(text, start, end)]


def _shouted(word: str) -> bool:
    """A word in capitals throughout, three letters or more ("BROWN"; not "II", "J.R.R" or "US")."""
    letters = [c for c in word if c.isalpha()]
    return len(letters) >= 3 and all(c.isupper() for c in letters)


def _is_cap(word: str) -> bool:
    return word[:1].isupper() or word.lstrip("-")[:1].isdigit()


def _has_letter(text: str) -> bool:
    return re.search(r"[^\W\d_]", text) is not None


def _sentence_end(text: str) -> int:
    """End of the first sentence: the first . ! ? ; before a space or the end, not after "F." or "Dr."."""
    for m in re.finditer(r"[.!?;](?=\s|$)", text):
        if m.group(0) == ".":
            before = re.search(r"([\w']+)$", text[: m.start()])
            word = before.group(1) if before else ""
            if re.fullmatch(r"[A-Z]", word) or word.lower() in ABBREVIATIONS:
                continue
        return m.start()
    return len(text)


def _runs(words: list[Word], keep, text: str | None, bridges=NAME_CONNECTORS, alone=()) -> list[list[Word]]:
    """Maximal runs of words passing keep(word), joined across `bridges` words ("Leonardo da Vinci"); with
    `text`, only spaces, '-', '&' or '. ' after an initial join words; an `alone` word is a run of its own."""
    kept = [keep(w) for w, _, _ in words]
    runs: list[list[Word]] = [[]]
    i = 0
    while i < len(words):
        cur = runs[-1]
        if kept[i]:
            gap = text[cur[-1][2] : words[i][1]].strip() if cur and text is not None else ""
            if _norm(words[i][0]) in alone:
                runs += [[words[i]], []]
            elif gap in {"", "-", "&"} or (gap == "." and _INITIAL.fullmatch(cur[-1][0])):
                cur.append(words[i])
            else:
                runs.append([words[i]])
            i += 1
            continue
        j = i
        while j < len(words) and words[j][0].lower() in bridges and not kept[j]:
            j += 1
        if cur and i < j < len(words) and kept[j]:
            pairs = zip(words[i - 1 : j], words[i : j + 1], strict=True)
            if text is None or all(not text[a[2] : b[1]].strip() for a, b in pairs):
                cur.extend(words[i:j])
                i = j
                continue
        if cur:
            runs.append([])
        i += 1
    return [r for r in runs if r]


def short_answer_span(answer: str, question: str) -> tuple[int, int] | None:
    """Deterministic E_A for a wrong answer (METHOD A3): the [start, end) span in the stripped generation of
    the entity or short phrase that answers (None: none). Steps: 1. a leading yes/no; 2. a quoted span or
    named run; 3. a lowercase phrase's head; 4. a capitalized run, else the last non-stop word."""
    line = answer.split("\n", 1)[0]
    start = len(line) - len(line.lstrip())
    while (m := _LEADING_ANY.match(line, start)) and m.end() > start and line[m.end() :].strip():
        start = m.end()
    end = start + _sentence_end(line[start:])
    words = _words(line, start, end)
    if not words:
        return None
    if _norm(words[0][0]) in {"yes", "no"}:
        return words[0][1], words[0][2]
    qstems = {_stem(w) for w, _, _ in _words(question)}

    def is_q(w: str) -> bool:
        return _stem(w) in qstems

    def span_of(run: list[Word]) -> tuple[int, int]:
        run = run[:MAX_EA_WORDS]
        while len(run) > 1 and run[-1][0].lower() in NAME_CONNECTORS:
            run = run[:-1]
        return run[0][1], run[-1][2]

    def trimmed(run: list[Word]) -> list[Word]:  # without stop words and connectors at either end
        kept = [k for k, (w, _, _) in enumerate(run) if not (_is_stop(w) or w.lower() in NAME_CONNECTORS)]
        return run[kept[0] : kept[-1] + 1] if kept else []

    def named(w: str) -> bool:
        return _is_cap(w) and not _is_stop(w)

    def phrase_word(w: str) -> bool:  # of a lowercase answer phrase (step 3)
        return _is_content(w) and not is_q(w) and len(_norm(w)) > 1

    def name_word(w: str) -> bool:  # of a named run (step 2)
        return named(w) and _norm(w) not in FRAME_WORDS

    candidates: list[tuple[int, int]] = []
    for m in _QUOTED.finditer(line, start, end):
        quote = 1 if m.group(1) is not None else 2  # the group of "straight" or “curly” quotes
        inner = _words(line, *m.span(quote))
        if inner and not all(is_q(w) or _is_stop(w) for w, _, _ in inner):
            candidates.append(span_of(inner))
    anchored: list[tuple[int, int]] = []
    for run in map(trimmed, _runs(words, name_word, line)):
        # "King Louis XF" -> "Louis XF" ("Queen of England" keeps its title): gold aliases omit titles
        last = max((k for k, (w, _, _) in enumerate(run) if _norm(w) in TITLE_WORDS), default=-1)
        after = run[last + 1][0] if 0 <= last < len(run) - 1 else ""
        if _is_cap(after) and after.lower() not in NAME_CONNECTORS:
            run = run[last + 1 :]
        # "BROWN BARBADO OPERA" -> "OPERA": capitals split into many tokens; the last word keeps the position
        if len(run) >= 2 and all(_shouted(w) for w, _, _ in run):
            run = run[-1:]
        if run and not all(is_q(w) for w, _, _ in run):
            candidates.append(span_of(run))
            # anchored: the nearest non-stop word before it restates the question's relation ("born in India")
            before = words[: words.index(run[0])]
            prev = next((w for w, _, _ in reversed(before) if not _is_stop(w)), "")
            if prev[:1].islower() and is_q(prev) and _has_letter(run[0][0]):
                anchored.append(candidates[-1])
    if candidates:
        return min(anchored or candidates)
    # 3. a lowercase phrase in the first clause, else in the sentence
    clause_break = _CLAUSE_BREAK.search(line, words[0][2], end)
    clause_end = clause_break.start() if clause_break else end
    for hi in (clause_end, end):
        phrases = [r for r in map(trimmed, _runs(_words(line, start, hi), phrase_word, line)) if r]
        if phrases:
            # the head: English noun phrases end in it ("a professional skier" -> "skier"), so the probe's
            # position stays; one with a connector ("god of war") has its head before it and is kept whole
            run = phrases[0][:MAX_EA_PHRASE]
            has_connector = any(w.lower() in NAME_CONNECTORS for w, _, _ in run)
            return span_of(run if has_connector else run[-1:])
    # 4. only a restatement of the question
    caps = [r for r in map(trimmed, _runs(words, named, line)) if r]
    if caps:
        return span_of(caps[0])
    rest = [w for w in words if not _is_stop(w[0])] or words
    return rest[-1][1], rest[-1][2]


def question_spans(question: str, dataset: str, subj=None, prop=None) -> list[tuple[int, int]]:
    """Deterministic E_Q (METHOD A4): sorted spans of subject and property words; a set's own rule first."""
    own_rule = registry.get(dataset).question_spans if registry.is_qa(dataset) else None
    own = own_rule(question, {"subj": subj, "prop": prop}) if own_rule else None
    if own is not None:  # None where the set's own rule does not apply
        return own
    words = _words(question)
    mixed = any(_is_cap(w) and not w.isdigit() and w != "I" for w, _, _ in words[1:])
    spans = _named_spans(question) if mixed else []
    if any(_has_letter(question[s:e]) for s, e in spans):
        return sorted(spans)
    runs = _runs(words, _is_content, None, CHUNK_BRIDGES, RELATION_VERBS)
    chunks = [[w for w in r if _is_content(w[0])] for r in runs]

    def size(chunk: list[Word]) -> tuple[int, int]:  # words, then words with letters
        return len(chunk), sum(_has_letter(w) for w, _, _ in chunk)

    subject = max(reversed(chunks), key=size, default=[])  # the largest chunk; on a tie, the last
    lettered = [w for c in chunks for w in c if _has_letter(w[0])]
    picked = set(subject[-MAX_SUBJECT_WORDS:]) | set(lettered[:1])  # the property: first content word
    picked |= {w for c in chunks for w in c if not _has_letter(w[0])}  # every number

    def overlaps_picked(span: tuple[int, int]) -> bool:
        return any(a < span[1] and span[0] < b for _, a, b in picked)

    apart = {sp for sp in spans if not overlaps_picked(sp)}
    return sorted({(s, e) for _, s, e in picked} | apart)


def _named_spans(question: str) -> list[tuple[int, int]]:
    """Quoted spans, capitalized runs and numbers of a mixed-case question."""
    spans = [m.span(1 if m.group(1) else 2) for m in _QUOTED.finditer(question)]
    # capitalized runs, connectors inside ("Statue of Liberty"); not text.NAME_CONNECTORS: E_Q would change
    connector = r"(?:of(?:\s+the)?|de|la|le|von|van|der|du|da|del|di)"
    cap = r"[A-Z][\w'\-\.]*"
    runs = re.finditer(rf"\b{cap}(?:\s+(?:{connector}\s+)?{cap})*", question)
    for m in chain(runs, re.finditer(r"\b\d[\d,]*(?:\.\d+)?\b", question)):  # then numbers
        s, e = m.span()
        words = m.group(0).split()
        if not question[:s].strip() and words[0].lower() in STOPWORDS:  # a sentence-initial "What", "The"
            if len(words) == 1:
                continue
            s = re.compile(" *").match(question, s + len(words[0]) + 1).end()
        if not any(a <= s < b for a, b in spans):
            spans.append((s, e))
    return spans


def locate(
    tokenizer, prompt: str, prompt_ids: list[int], chat: bool, question: str, eq_spans, answer_ids, ea_span
) -> tuple[list[int], list[int], list[int], str | None]:
    """Map E_Q (`eq_spans`, char spans in `question`) and E_A (`ea_span`, a char span in the stripped answer,
    or None) to positions in prompt_ids + answer_ids. Returns (E_Q, E_A, question positions, drop reason)."""
    enc = tokenizer(prompt, add_special_tokens=not chat, return_offsets_mapping=True)
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    if list(enc["input_ids"]) != list(prompt_ids):
        return [], [], [], "prompt_retokenization_mismatch"
    q0 = prompt.rfind(question)
    if q0 < 0:
        return [], [], [], "question_not_in_prompt"
    question_pos = _overlap_tokens(offsets, q0, q0 + len(question))
    eq = sorted({i for s, e in eq_spans for i in _overlap_tokens(offsets, q0 + s, q0 + e)})
    if not eq:
        return [], [], question_pos, "eq_not_found"
    if ea_span is None:
        return eq, [], question_pos, "ea_not_found"
    # each generated token's characters in decode(answer_ids), by incremental decoding
    texts = [tokenizer.decode(answer_ids[: i + 1], skip_special_tokens=True) for i in range(len(answer_ids))]
    ends = list(accumulate((len(t) for t in texts), max, initial=0))
    lead = len(texts[-1]) - len(texts[-1].lstrip()) if texts else 0
    a, b = (x + lead for x in ea_span)
    ea = [len(prompt_ids) + i for i in _overlap_tokens(list(pairwise(ends)), a, b)]
    return eq, ea, question_pos, None if ea else "ea_not_found"


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
    """The ROC AUC of a position feature alone for 'wrong', folded to >= 0.5; NaN with one class only."""
    wrong = ~np.asarray(correct, dtype=bool)
    if wrong.all() or not wrong.any():
        return float("nan")
    auc = roc_auc(wrong, np.asarray(value, dtype=float))
    return max(auc, 1.0 - auc)


def class_table(samples: pl.DataFrame, model: str, dataset: str) -> pl.DataFrame:
    """Per answer class of one (model, dataset): CLASS_TABLE_SCHEMA's counts, means and AUCs (METHOD A3)."""
    auc_len = position_only_auc(samples["correct"], samples["n_ea"])
    auc_pos = position_only_auc(samples["correct"], samples["probe_position"])
    cls = pl.when(pl.col("correct")).then(pl.lit("correct")).otherwise(pl.lit("wrong"))
    table = samples.group_by(cls.alias("class")).agg(
        model=pl.lit(model),
        dataset=pl.lit(dataset),
        n=pl.len(),
        mean_ea_tokens=pl.col("n_ea").mean().round(2),
        mean_eq_tokens=pl.col("n_eq").mean().round(2),
        median_eq_share=(pl.col("n_eq") / pl.col("question_positions").list.len()).median().round(3),
        n_no_matched_control=(~pl.col("control_matched")).sum(),
        auc_ea_length_only=pl.lit(round(auc_len, 3)),
        auc_position_only=pl.lit(round(auc_pos, 3)),
    )
    return table.select(list(CLASS_TABLE_SCHEMA)).cast(CLASS_TABLE_SCHEMA).sort("class")
