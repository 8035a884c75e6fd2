"""Answer labelling (METHOD A2): SQuAD-style normalization, alias containment and span, echoes, refusals."""

import re
from dataclasses import dataclass

import polars as pl

from ..text import NAME_CONNECTORS, STOPWORDS, Word, normalize_text, normalized_words

_REFUSAL = re.compile(
    r"(?i)\bi (?:do not|don't|dont) know\b|\bunknown\b|\bnot sure\b|\bi(?: am|'m) sorry\b|"
    r"\bcan(?: ?not|'t) (?:answer|be determined|provide)\b|\bno (?:information|answer)\b|\bas an ai\b|"
    r"\bi (?:have no|lack) (?:idea|information)\b|\bunable to (?:answer|determine|provide)\b"
)

COORDINATORS = {"or", "and", "nor", "vs", "versus", "&"}
POLAR = {"yes", "no"}
_BOUNDARY = re.compile(r"[,;:?!()\[\]]")
MAX_OPTION_WORDS = 6


def _find_all(tokens: list[str], target: list[str]) -> list[int]:
    n = len(target)
    if n == 0:
        return []
    return [i for i in range(len(tokens) - n + 1) if tokens[i : i + n] == target]


def _is_content(word: str) -> bool:
    return word not in STOPWORDS and word not in COORDINATORS


@dataclass(frozen=True)
class AliasMatch:
    """One answer's match: `alias` None when it is wrong; echo_rejected: an alias occurs only in echoes."""

    alias: str | None = None
    start: int | None = None
    end: int | None = None
    echo_rejected: bool = False

    @property
    def correct(self) -> bool:
        return self.alias is not None


def _gap(question: str, qw: list[Word], i: int, j: int, pattern) -> bool:
    """Whether the text between question words i and j (either order) holds a match of `pattern`."""
    a, b = sorted((i, j))
    return re.search(pattern, question[qw[a][2] : qw[b][1]]) is not None


def _option_words(qw: list[Word], question: str, j: int, step: int) -> list[str]:
    """The option at question word j, direction `step`: right, up to MAX_OPTION_WORDS content or capitalized
    words (connectors inside) up to punctuation, a coordinator or stop word; left, a capitalized name or j."""
    # capitalized (not as the question's first character) or a number: a word of a name
    cap = [(question[s].isupper() and s > 0) or question[s].isdigit() for _, s, _ in qw]
    usable = [_is_content(w) or c for (w, _, _), c in zip(qw, cap, strict=True)]
    if not (0 <= j < len(qw)) or not usable[j] or qw[j][0] in COORDINATORS:
        return []
    out = []
    capitalized = cap[j]
    k = j
    while 0 <= k < len(qw) and len(out) < MAX_OPTION_WORDS:
        w = qw[k][0]
        if out:
            if _gap(question, qw, k - step, k, _BOUNDARY) or w in COORDINATORS:
                break
            nxt = k + step
            connector = w in NAME_CONNECTORS and 0 <= nxt < len(qw) and usable[nxt]
            if step < 0:  # leftwards only a capitalized name grows: a capitalized word, or a connector in it
                joins_name = cap[k] or (connector and cap[nxt])
                if not capitalized or not joins_name:
                    break
            if step > 0 and not usable[k] and not connector:
                break
        out.append(w)
        k += step
    return out if step > 0 else out[::-1]


def choice_options(question: str, alias: str) -> list[list[str]]:
    """The other options of a choice question offering `alias` ("Mars or Jupiter?", "A, B, or C"): the names
    joined to it by or/and/nor/vs (commas inside such a list), as normalized words; [] if not offered so."""
    qw = normalized_words(question)
    tokens = [w for w, _, _ in qw]
    target = normalize_text(alias).split()
    n = len(target)
    for i in _find_all(tokens, target):
        options = []
        coord = False  # whether a coordinator joins the options: a list without one offers no choice
        for step in (1, -1):
            # j: the first word outside the alias in this direction; edge: the last word of the items taken
            if step > 0:
                j, edge = i + n, i + n - 1
            else:
                j, edge = i - 1, i
            while 0 <= j < len(qw):
                by_comma = _gap(question, qw, edge, j, r"[,;]")
                if tokens[j] in COORDINATORS:
                    coord = True
                    by_comma = False
                    j += step
                elif not by_comma:
                    break
                opt = _option_words(qw, question, j, step)
                if not opt:
                    break
                far = j + step * len(opt)  # the first word beyond this option
                # an option after a comma is closed on its far side: by the end, a coordinator or , ; ?
                if by_comma and 0 <= far < len(qw) and tokens[far] not in COORDINATORS:
                    if not _gap(question, qw, far - step, far, r"[,;?]"):
                        break
                options.append(opt)
                edge = far - step
                j = far
        if coord and options:
            return options
    return []


def _echo_by_copy(ans: list[str], a: int, n: int, q: list[str]) -> bool:
    """Whether ans[a:a+n] lies in a longer run copied from the question, with a content word beyond it."""
    left, right = a, a + n
    while left > 0 and _find_all(q, ans[left - 1 : a + n]):
        left -= 1
    while right < len(ans) and _find_all(q, ans[a : right + 1]):
        right += 1
    return any(_is_content(w) for w in ans[left:a] + ans[a + n : right])


def _match_choice(ans: list[str], target: list[str], options: list[list[str]]) -> int:
    """Word index of the gold occurrence the answer commits to (rule 3 of match_answer), or -1."""
    mentions = [(i, i + len(target), 0) for i in _find_all(ans, target)]  # (start, end, option id: 0 = gold)
    in_gold = {k for s, e, _ in mentions for k in range(s, e)}
    for oid, opt in enumerate(options, start=1):
        distinct = {w for w in opt if _is_content(w) and w not in target}
        mentions += [(k, k + 1, oid) for k, w in enumerate(ans) if w in distinct and k not in in_gold]
    merged: list[tuple[int, int, int]] = []  # contiguous words of another option are one mention
    for s, e, o in sorted(mentions):
        if merged and o != 0 and merged[-1][2] == o and merged[-1][1] >= s:
            merged[-1] = (merged[-1][0], max(e, merged[-1][1]), o)
        else:
            merged.append((s, e, o))
    listed = [False] * len(merged)
    for m in range(len(merged) - 1):
        _, e1, o1 = merged[m]
        s2, _, o2 = merged[m + 1]
        between = ans[e1:s2]
        # two different options side by side ("X, Y") or joined by and/or ("X or Y", "both X and Y")
        if o1 != o2 and set(between) <= COORDINATORS | {"both", "either", "neither"}:
            if not between or any(w in COORDINATORS for w in between):
                listed[m] = listed[m + 1] = True
    for (s, _, o), is_listed in zip(merged, listed, strict=True):
        if not is_listed:
            return s if o == 0 else -1
    return -1


def match_answer(answer: str, aliases: list[str], question: str | None = None) -> AliasMatch:
    """Match an answer against its gold aliases (METHOD A2: the echo rule), longest first; the first one the
    answer commits to gives the label, the alias and its span in the raw answer. Without a question: plain
    containment. With it: 1. yes/no gold; 2. an alias absent from the question; 3. a choice question: the
    option named first, by the gold alias or a content word of another option ("Lincoln" names "Abraham
    Lincoln"); 4. an alias in the question, outside echoes. Echo-rejected: wrong, an alias only echoed."""
    ans_words = normalized_words(answer)
    tokens = [w for w, _, _ in ans_words]
    q_tokens = normalize_text(question).split() if question is not None else None
    echo = False
    for alias in sorted(aliases, key=lambda a: -len(normalize_text(a))):
        target = normalize_text(alias).split()
        n = len(target)
        starts = _find_all(tokens, target)
        if not starts:
            continue
        if q_tokens is not None and n == 1 and target[0] in POLAR:  # the answer's first yes/no decides
            first_polar = next(w for w in tokens if w in POLAR)
            hit = starts[0] if first_polar == target[0] else -1
        elif q_tokens is None or not _find_all(q_tokens, target):
            hit = starts[0]
        else:
            options = choice_options(question, alias)
            if options:
                hit = _match_choice(tokens, target, options)
            else:  # the first occurrence outside a run copied from the question
                own = (i for i in starts if not _echo_by_copy(tokens, i, n, q_tokens))
                hit = next(own, -1)
            echo = echo or hit < 0
        if hit >= 0:
            return AliasMatch(alias, ans_words[hit][1], ans_words[hit + n - 1][2], False)
    return AliasMatch(echo_rejected=echo)


def is_refusal(answer: str) -> bool:
    return not answer.strip() or bool(_REFUSAL.search(answer))


LABEL_SCHEMA = {
    "correct": pl.Boolean,
    "matched_alias": pl.String,
    "match_start": pl.Int64,
    "match_end": pl.Int64,
    "echo_rejected": pl.Boolean,
    "refusal": pl.Boolean,
}


def label_frame(answers: pl.DataFrame, questions: pl.DataFrame) -> pl.DataFrame:
    """answers (id, answer) + LABEL_SCHEMA, by questions' id, answers and question (if any: the echo rule)."""
    text = questions["question"] if "question" in questions.columns else [None] * questions.height
    aliases = questions["answers"].to_list()
    # id -> match_answer's (aliases, question)
    gold = {qid: (a, q) for qid, a, q in zip(questions["id"], aliases, text, strict=True)}
    rows = []
    for i, a in zip(answers["id"], answers["answer"], strict=True):
        m = match_answer(a, *gold[i])
        refusal = not m.correct and is_refusal(a)
        rows.append((m.correct, m.alias, m.start, m.end, m.echo_rejected, refusal))
    labels = pl.DataFrame(rows, schema=LABEL_SCHEMA, orient="row")
    return answers.with_columns(labels.get_columns())


def accuracy_table(labelled: pl.DataFrame, model: str, dataset: str) -> pl.DataFrame:
    n = {c: pl.col(c).sum().cast(pl.Int64).alias(f"n_{c}") for c in ("correct", "refusal", "echo_rejected")}
    keys = (
        pl.lit(model).alias("model"),
        pl.lit(dataset).alias("dataset"),
        pl.len().cast(pl.Int64).alias("n"),
    )
    accuracy = pl.col("correct").mean().fill_null(float("nan")).alias("accuracy")
    return labelled.select(*keys, n["correct"], accuracy, n["refusal"], n["echo_rejected"])
