"""Answer labelling (METHOD A2): SQuAD-style normalization, alias containment with its character span, the
echo rule, refusal flags."""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from ..text import ARTICLES, PUNCT, STOPWORDS, Word, normalize_text, normalized_words  # noqa: F401

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

COORDINATORS = {"or", "and", "nor", "vs", "versus", "&"}
POLAR = {"yes", "no"}
# lowercase words allowed inside a capitalized option name ("Leonardo da Vinci", "Statue of Liberty")
NAME_CONNECTORS = {
    "of",
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
    "en",
    "bin",
    "al",
}
_BOUNDARY = re.compile(r"[,;:?!()\[\]]")
MAX_OPTION_WORDS = 6


def _find_all(tokens: list[str], target: list[str]) -> list[int]:
    n = len(target)
    return [i for i in range(len(tokens) - n + 1) if tokens[i : i + n] == target] if n else []


def _contains(tokens: list[str], target: list[str]) -> bool:
    return bool(_find_all(tokens, target))


def _is_content(word: str) -> bool:
    return word not in STOPWORDS and word not in COORDINATORS


@dataclass(frozen=True)
class AliasMatch:
    """The result of matching one answer against its gold aliases. `alias` is None when the answer is not
    correct; `echo_rejected` is True when some alias occurs in the answer but only inside an echo."""

    alias: str | None = None
    start: int | None = None
    end: int | None = None
    echo_rejected: bool = False

    @property
    def correct(self) -> bool:
        return self.alias is not None


def _option_words(qw: list[Word], question: str, j: int, step: int) -> list[str]:
    """The option name that starts at question word j and extends in direction `step` (+1 right, -1 left).
    To the right: content or capitalized words (with name connectors such as "of" inside) up to
    MAX_OPTION_WORDS, stopping at punctuation, a coordinator or a lowercase stop word. To the left: a
    capitalized name (with connectors inside) when word j is capitalized, else the one word j."""

    def cap(k: int) -> bool:
        ch = question[qw[k][1]]
        return (ch.isupper() and qw[k][1] > 0) or ch.isdigit()

    def usable(k: int) -> bool:
        return _is_content(qw[k][0]) or cap(k)

    out: list[str] = []
    if not (0 <= j < len(qw)) or not usable(j) or qw[j][0] in COORDINATORS:
        return out
    capitalized = cap(j)
    k = j
    while 0 <= k < len(qw) and len(out) < MAX_OPTION_WORDS:
        w = qw[k][0]
        if out:
            a, b = (k - step, k) if step > 0 else (k, k - step)
            if _BOUNDARY.search(question[qw[a][2] : qw[b][1]]) or w in COORDINATORS:
                break
            nxt = k + step
            connector = w in NAME_CONNECTORS and 0 <= nxt < len(qw) and usable(nxt)
            if step < 0 and not capitalized:
                break
            if step < 0 and not cap(k) and not (connector and cap(nxt)):
                break
            if step > 0 and not usable(k) and not connector:
                break
        out.append(w)
        k += step
    return out if step > 0 else out[::-1]


def _closed(question: str, qw: list[Word], inner: int, outer: int) -> bool:
    """True when an option ending at question word `inner` is closed on its far side: `outer` (the next word
    outwards) is past either end, is a coordinator, or is set off by a comma/semicolon/question mark."""
    if not 0 <= outer < len(qw):
        return True
    a, b = min(inner, outer), max(inner, outer)
    return qw[outer][0] in COORDINATORS or bool(re.search(r"[,;?]", question[qw[a][2] : qw[b][1]]))


def choice_options(question: str, alias: str) -> list[list[str]]:
    """The other options of a choice question that offers `alias` ("Which is larger, Mars or Jupiter?",
    "Between X and Y, which ...", "A, B, or C"): the names joined to the alias's occurrence in the question by
    or/and/nor/vs (and commas inside such a list). Empty when the question does not offer the alias as one
    of several options. Each option is returned as its normalized words."""
    qw = normalized_words(question)
    tokens = [w for w, _, _ in qw]
    target = normalize_text(alias).split()
    n = len(target)
    for i in _find_all(tokens, target):
        options: list[list[str]] = []
        coord = False
        for step in (1, -1):
            j = i + n if step > 0 else i - 1  # first word outside the alias in this direction
            edge = i + n - 1 if step > 0 else i  # last word of the item already taken
            while 0 <= j < len(qw):
                a, b = (edge, j) if step > 0 else (j, edge)
                by_comma = bool(re.search(r"[,;]", question[qw[a][2] : qw[b][1]]))
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
                if by_comma and not _closed(question, qw, far - step, far):
                    break
                options.append(opt)
                edge = far - step
                j = far
        if coord and options:
            return options
    return []


def _echo_by_copy(ans: list[str], a: int, n: int, q: list[str]) -> bool:
    """True when the alias occurrence ans[a:a+n] lies inside a longer run of answer words copied verbatim from
    the question, and the copied words beyond the alias include a content word."""
    left = a
    while left > 0 and _contains(q, ans[left - 1 : a + n]):
        left -= 1
    right = a + n
    while right < len(ans) and _contains(q, ans[a : right + 1]):
        right += 1
    return any(_is_content(w) for w in ans[left:a] + ans[a + n : right])


def _match_choice(ans: list[str], target: list[str], options: list[list[str]]) -> int:
    """Word index of the gold occurrence the answer commits to (rule 3 of match_answer), or -1."""
    gold_words = set(target)
    mentions: list[tuple[int, int, int]] = []  # (start word, end word, option id: 0 = gold)
    for i in _find_all(ans, target):
        mentions.append((i, i + len(target), 0))
    for oid, opt in enumerate(options, start=1):
        distinct = [w for w in opt if _is_content(w) and w not in gold_words]
        for k, w in enumerate(ans):
            if w in distinct and not any(s <= k < e for s, e, o in mentions if o == 0):
                mentions.append((k, k + 1, oid))
    if not any(o == 0 for *_, o in mentions):
        return -1
    mentions.sort()
    merged: list[tuple[int, int, int]] = []  # contiguous words of another option are one mention
    for s, e, o in mentions:
        if merged and o != 0 and merged[-1][2] == o and merged[-1][1] >= s:
            merged[-1] = (merged[-1][0], max(e, merged[-1][1]), o)
        else:
            merged.append((s, e, o))
    listed = [False] * len(merged)
    for m in range(len(merged) - 1):
        (_, e1, o1), (s2, _, o2) = merged[m], merged[m + 1]
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
    """Match an answer against its gold aliases (METHOD A2). Aliases are tried longest first; the first one
    that the answer commits to gives the label, the matched alias and its character span in the raw answer.

    The echo rule, in plain words. Text is compared after normalization (lowercase, punctuation and the
    articles a/an/the dropped). Without a question, an alias counts wherever its words occur contiguously
    in the answer (plain containment). With the question:
    1. Yes/no gold ("yes" or "no"): the answer commits to the first "yes" or "no" word it says; it is correct
       when that word is the gold one ("No, they are not" answers "no"; "Yes ... no" answers "yes").
    2. An alias that does not occur in the question: plain containment, as without a question.
    3. A choice question, i.e. the question offers the alias as one of several options joined by "or",
       "and", "nor", "vs" or a comma list ("Which is larger, Mars or Jupiter?", "Between X and Y, which
       ..."): the answer's choice is the option it names first, where an option counts as named when the
       answer says the gold alias or any content word of another option that is not a word of the gold
       alias ("Lincoln" names "Abraham Lincoln"; "Lake" names neither "Lake Baikal" nor "Lake Tanganyika"),
       and options the answer lists together joined by and/or ("Both Mars and Jupiter are planets",
       "Mars or Jupiter") are an echo and name nothing. Correct when the first named option is the gold
       alias: "Jupiter", "It is Jupiter", "Jupiter is larger than Mars" and "Between Mars and Jupiter,
       Jupiter" are correct; "Mars is larger than Jupiter" and "Both Mars and Jupiter are planets" are not.
       (A reversed comparative, "Mars is smaller than Jupiter", is therefore not counted as correct.)
    4. Any other alias that occurs in the question: an occurrence in the answer is an echo when it lies
       inside a longer stretch of answer words copied verbatim from the question and the copied words
       beyond the alias include a content word (not a stop word): for "Which planet is known as the Red
       Planet?", "It is known as the Red Planet" only echoes the alias "Red Planet"; "The Red Planet" or
       "It is the Red Planet" commit to it. The alias counts if any of its occurrences is not an echo.
    An answer is echo-rejected when it is not correct and some alias occurs in it but only as an echo
    (rules 3 and 4); an answer that contradicts a yes/no gold (rule 1) is wrong, not echo-rejected."""
    ans_words = normalized_words(answer)
    tokens = [w for w, _, _ in ans_words]
    q_tokens = normalize_text(question).split() if question is not None else None
    echo = False
    for alias in sorted(aliases, key=lambda a: -len(normalize_text(a))):
        target = normalize_text(alias).split()
        if not target:
            continue
        n = len(target)
        starts = _find_all(tokens, target)
        if not starts:
            continue
        if q_tokens is None:
            hit = starts[0]
        elif n == 1 and target[0] in POLAR:
            polar = next((i for i, w in enumerate(tokens) if w in POLAR), -1)
            hit = polar if polar >= 0 and tokens[polar] == target[0] else -1
        elif not _contains(q_tokens, target):
            hit = starts[0]
        else:
            options = choice_options(question, alias)
            if options:
                hit = _match_choice(tokens, target, options)
            else:
                hit = next((i for i in starts if not _echo_by_copy(tokens, i, n, q_tokens)), -1)
            echo = echo or hit < 0
        if hit >= 0:
            return AliasMatch(alias, ans_words[hit][1], ans_words[hit + n - 1][2], False)
    return AliasMatch(echo_rejected=echo)


def match_alias(answer: str, aliases: list[str], question: str | None = None) -> tuple[str, int, int] | None:
    """First gold alias (longest first) that the answer commits to; returns (alias, char_start, char_end) in
    the raw answer, or None. Without `question` this is plain containment of the normalized alias words;
    with it the echo rule of `match_answer` applies."""
    m = match_answer(answer, aliases, question)
    return (m.alias, m.start, m.end) if m.correct else None


def is_refusal(answer: str) -> bool:
    return not answer.strip() or bool(_REFUSAL.search(answer))


def label_frame(answers: pl.DataFrame, questions: pl.DataFrame) -> pl.DataFrame:
    """answers: id, answer, ...; questions: id, answers (gold aliases), question (its text; when the column is
    absent the echo rule is off). Adds correct, the matched alias and its span, echo_rejected and the refusal
    flag."""
    gold = dict(zip(questions["id"].to_list(), questions["answers"].to_list(), strict=True))
    qtext = (
        dict(zip(questions["id"].to_list(), questions["question"].to_list(), strict=True))
        if "question" in questions.columns
        else {}
    )
    rows = []
    for rec in answers.select("id", "answer").iter_rows(named=True):
        m = match_answer(rec["answer"], gold[rec["id"]], qtext.get(rec["id"]))
        rows.append(
            {
                "id": rec["id"],
                "correct": m.correct,
                "matched_alias": m.alias,
                "match_start": m.start,
                "match_end": m.end,
                "echo_rejected": m.echo_rejected,
                "refusal": not m.correct and is_refusal(rec["answer"]),
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
            "echo_rejected": pl.Boolean,
            "refusal": pl.Boolean,
        },
    )
    return answers.join(labels, on="id", how="left")


def accuracy_table(labelled: pl.DataFrame, model: str, dataset: str) -> pl.DataFrame:
    n = labelled.height
    n_correct = int(labelled["correct"].sum()) if n else 0
    n_echo = int(labelled["echo_rejected"].sum()) if n and "echo_rejected" in labelled.columns else 0
    return pl.DataFrame(
        {
            "model": [model],
            "dataset": [dataset],
            "n": [n],
            "n_correct": [n_correct],
            "accuracy": [n_correct / n if n else float("nan")],
            "n_refusal": [int(labelled["refusal"].sum()) if n else 0],
            "n_echo_rejected": [n_echo],
        }
    )
