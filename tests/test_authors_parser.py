"""depth.judge.parser: the DepthQA authors' verdict parser (`authors`: the leftmost of their cues, an optional
( or [, any integer) beside truthflow's `strict` one (the last [RESULT] with 1-5, else the only integer 1-5),
on the issue's examples, each of their cues, bracket and case variants, and verdicts with several cues."""

from __future__ import annotations

import pytest

from truthflow.depth import judge
from truthflow.depth.judge import AUTHORS_CUES, parse_verdict, parse_verdict_authors, read_verdict

# their cues as a judge writes them (AUTHORS_CUES holds them as regexes)
CUES = ["[RESULT]", "Score", "[SCORE]", "[RESULT]:", "Score:", "score:", "Result:", "[Result]", "score of"]
CUES += ["Feedback:", "feedback:"]


@pytest.mark.parametrize(
    ("text", "authors", "strict"),
    [
        # the issue's examples: the leftmost cue wins, any integer after it, a decimal's integer part
        ("The answer is fine, but a score of 5 requires more detail. [RESULT] 3", 5, 3),
        ("It covers 2 of the 3 points. Score: 4", 4, None),
        ("Accurate. [RESULT] 4.5", 4, None),
        # any integer, in or out of 1-5
        ("[RESULT] 0", 0, None),
        ("Score: 10", 10, None),
        ("[RESULT] 6", 6, None),
        # no cue: the authors' parser has no fallback
        ("4", None, 4),
        ("It earns a 3, I think", None, 3),
        ("", None, None),
        (None, None, None),
        # a cue whose next character is neither space, bracket nor digit is no cue there
        ("Scores: 4", None, 4),
        ("Good job. [3]", None, 3),  # in their own list of test cases, yet their pattern finds no cue
    ],
)
def test_issue_examples(text, authors, strict) -> None:
    assert (parse_verdict_authors(text), parse_verdict(text)) == (authors, strict)


def test_every_cue_in_their_list() -> None:
    assert len(CUES) == len(AUTHORS_CUES) == 11
    for cue in CUES:
        for gap in (" ", "", "  \n"):
            assert parse_verdict_authors(f"Clear and right. {cue}{gap}4") == 4, (cue, gap)
        assert parse_verdict_authors(f"Clear and right. {cue} four") is None, cue


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("[RESULT] (5)", 5),
        ("[RESULT] ( 5 )", 5),
        ("[RESULT] [4]", 4),
        ("[RESULT][ 4 ]", 4),
        ("(Score 5)", 5),
        ("[Score 4]", 4),
        ("Score:(2)", 2),
        ("score  of\n1", 1),
        ("[RESULT] 4/5", 4),
        ("[RESULT] 5 out of 5", 5),
        ("[RESULT] {3}", None),  # only ( or [ may stand between a cue and its number
        ("[RESULT] ((3))", None),  # and only one
    ],
)
def test_bracket_variants(text, score) -> None:
    assert parse_verdict_authors(text) == score


@pytest.mark.parametrize(
    "text", ["[result] 2", "[Result] 2", "[score] 2", "SCORE 2", "score: 2", "RESULT: 2", "Score Of 2"]
)
def test_case_is_ignored(text) -> None:
    assert parse_verdict_authors(text) == 2


@pytest.mark.parametrize(
    ("text", "score"),
    [
        # "Feedback:" is followed by words, so the next cue counts
        ("Feedback: good. [RESULT] 4", 4),
        ("Feedback: 3 of the facts are right. [RESULT] 5", 3),
        ("Score: 2. On reflection, [RESULT] 4", 2),
        ("[RESULT] 1 ... later [RESULT] 3", 1),
        ("[RESULT] Score: 2", 2),  # "[RESULT]" has no integer after it; "Score:" has
        ("A score of 10 is impossible here. [RESULT] 4", 10),
    ],
)
def test_several_cues_the_leftmost_wins(text, score) -> None:
    assert parse_verdict_authors(text) == score


def test_read_verdict_takes_the_parser() -> None:
    text = "Feedback: the response covers 2 of the 3 points. Score: 4"
    assert read_verdict(text).score is None
    verdict = read_verdict(text, "authors")
    assert verdict.score == 4 and verdict.raw == text
    assert read_verdict("I cannot grade this.", "authors").reason.startswith("unparseable verdict: ")
    assert judge.PARSERS == ("strict", "authors")
