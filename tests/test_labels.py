import json

import polars as pl
import pytest

from truthflow.pathways.labels import accuracy_table, choice_options, is_refusal, label_frame, match_answer
from truthflow.text import normalize_text, normalized_words


def test_normalize_hand_cases():
    assert normalize_text("The  U.S. Army!") == "us army"
    assert normalize_text("An apple, a day") == "apple day"
    assert normalize_text("Théâtre") == "théâtre"


def test_normalized_words_keep_character_spans():
    text = "It is The Eiffel-Tower."
    words = normalized_words(text)
    assert [w for w, _, _ in words] == ["it", "is", "eiffeltower"]
    assert text[words[-1][1] : words[-1][2]] == "Eiffel-Tower"


def test_match_answer_span_and_word_boundaries():
    answer = "I think the capital is Paris, France."
    m = match_answer(answer, ["paris france", "Lyon"])
    assert m.alias == "paris france" and answer[m.start : m.end] == "Paris, France"
    # containment is by whole words: "5" is not inside "1500"
    assert not match_answer("It was built in 1500.", ["5"]).correct
    assert not match_answer("", ["Paris"]).correct


def test_longest_alias_wins():
    m = match_answer("The United States of America", ["United States", "United States of America"])
    assert m.alias == "United States of America" and (m.start, m.end) == (4, 28)


def test_refusals():
    assert is_refusal("I don't know.")
    assert is_refusal("The answer is unknown")
    assert is_refusal("   ")
    assert not is_refusal("Paris")


def test_label_frame_counts():
    answers = pl.DataFrame({"id": ["a", "b", "c"], "answer": ["Paris.", "I'm sorry, I can't answer", "Rome"]})
    questions = pl.DataFrame({"id": ["a", "b", "c"], "answers": [["Paris"], ["Berlin"], ["Madrid"]]})
    out = label_frame(answers, questions)
    assert out["correct"].to_list() == [True, False, False]
    assert out["refusal"].to_list() == [False, True, False]
    assert out["match_start"].to_list()[0] == 0 and out["match_end"].to_list()[0] == 5


# ------------------------------------------------------------------ the echo rule (METHOD A2)
MARS = "Which is larger, Mars or Jupiter?"


@pytest.mark.parametrize(
    "answer,correct,echo",
    [
        ("Jupiter is larger than Mars.", True, False),
        ("Jupiter", True, False),
        ("It is Jupiter.", True, False),
        ("Between Mars and Jupiter, Jupiter is larger.", True, False),
        ("Mars or Jupiter? Jupiter.", True, False),
        ("Mars is larger than Jupiter.", False, True),
        ("Both Mars and Jupiter are planets.", False, True),
        ("Mars or Jupiter", False, True),
        ("Mars", False, False),  # the alias is not in the answer at all: wrong, not an echo
    ],
)
def test_echo_rule_choice_question(answer, correct, echo):
    m = match_answer(answer, ["Jupiter"], MARS)
    assert (m.correct, m.echo_rejected) == (correct, echo)
    # without the question the old plain containment is kept
    assert match_answer(answer, ["Jupiter"]).correct == ("jupiter" in answer.lower())


def test_echo_rule_span_is_the_committed_occurrence():
    answer = "Between Mars and Jupiter, Jupiter is larger."
    m = match_answer(answer, ["Jupiter"], MARS)
    assert (m.start, m.end) == (26, 33) and answer[m.start : m.end] == "Jupiter"


@pytest.mark.parametrize(
    "question,gold,answer,correct,echo",
    [
        # real HotpotQA comparison questions (AMOR dev subset), hand-written answers
        (
            "Who is older, Ferdi Taygan or Mahesh Bhupathi?",
            "Ferdi Taygan",
            "Ferdi Taygan is older.",
            True,
            False,
        ),
        (
            "Who is older, Ferdi Taygan or Mahesh Bhupathi?",
            "Ferdi Taygan",
            "Bhupathi is older than Ferdi Taygan.",
            False,
            True,
        ),
        (
            "Who is older, Ferdi Taygan or Mahesh Bhupathi?",
            "Ferdi Taygan",
            "Both Ferdi Taygan and Mahesh Bhupathi are tennis players.",
            False,
            True,
        ),
        (
            "Which lake is deeper, Lake Baikal or Lake Tanganyika?",
            "Lake Baikal",
            "Lake Tanganyika is deeper than Lake Baikal.",
            False,
            True,
        ),
        (
            "Which lake is deeper, Lake Baikal or Lake Tanganyika?",
            "Lake Baikal",
            "Lake Baikal is deeper than Lake Tanganyika.",
            True,
            False,
        ),
        (
            "Which is the Oil Capital of China, Chaoyang District, Shantou, or Daqing?",
            "Daqing",
            "Shantou, not Daqing.",
            False,
            True,
        ),
        (
            "Which is the Oil Capital of China, Chaoyang District, Shantou, or Daqing?",
            "Daqing",
            "Of Chaoyang District, Shantou, or Daqing, it is Daqing.",
            True,
            False,
        ),
        (
            "Which band has more members, Muzzle or Primus?",
            "Muzzle",
            "Muzzle has more members than Primus.",
            True,
            False,
        ),
        (
            "Which band has more members, Muzzle or Primus?",
            "Muzzle",
            "Primus has more members than Muzzle.",
            False,
            True,
        ),
        (
            "Who died first, Leonardo da Vinci or Raphael?",
            "Leonardo da Vinci",
            "Raphael died after Leonardo da Vinci.",
            False,
            True,
        ),
        (
            "In between Liberty and MIT Technology Review which has a circulation of over 200,000?",
            "Liberty",
            "Liberty.",
            True,
            False,
        ),
        (
            "In between Liberty and MIT Technology Review which has a circulation of over 200,000?",
            "Liberty",
            "MIT Technology Review, unlike Liberty.",
            False,
            True,
        ),
        (
            "Which company is an American petroleum company, EOG Resources Inc. or General Mills Inc.?",
            "EOG Resources, Inc.",
            "EOG Resources Inc. is.",
            True,
            False,
        ),
        # yes/no gold: the first yes/no word decides; a contradiction is wrong but not an echo
        (
            "Are both Delmer Daves and Jean-Pierre Jeunet film directors?",
            "yes",
            "Yes, both are film directors.",
            True,
            False,
        ),
        (
            "Are both Delmer Daves and Jean-Pierre Jeunet film directors?",
            "yes",
            "No, only Jeunet is; yes, Daves wrote.",
            False,
            False,
        ),
        (
            "Are both Delmer Daves and Jean-Pierre Jeunet film directors?",
            "yes",
            "Delmer Daves and Jean-Pierre Jeunet are both film directors.",
            False,
            False,
        ),
        (
            "Were H. G. Wells and Rubén Darío both English?",
            "no",
            "No, Rubén Darío was Nicaraguan.",
            True,
            False,
        ),
        # a non-choice question that contains the alias: a longer copy of the question is an echo
        (
            "Which planet is known as the Red Planet?",
            "The Red Planet",
            "It is known as the Red Planet.",
            False,
            True,
        ),
        ("Which planet is known as the Red Planet?", "The Red Planet", "The Red Planet.", True, False),
        ("which state is new york city in", "New York", "It is New York City.", False, True),
        ("which state is new york city in", "New York", "New York City is in New York.", True, False),
        ("which state is new york city in", "New York", "It is New York.", True, False),  # stop words only
    ],
)
def test_echo_rule_hand_cases(question, gold, answer, correct, echo):
    m = match_answer(answer, [gold], question)
    assert (m.correct, m.echo_rejected) == (correct, echo)


@pytest.mark.parametrize(
    "question,aliases,answer,matched",
    [
        # aliases absent from the question: plain containment, as before (TriviaQA / NQ)
        (
            "Who wrote the novel Oliver Twist?",
            ["Charles Dickens", "Dickens"],
            "Charles Dickens wrote Oliver Twist.",
            "Charles Dickens",
        ),
        ("how many legs does a spider have", ["eight", "8"], "A spider has 8 legs.", "8"),
        ("what is the capital of france", ["Paris"], "The capital of France is Paris.", "Paris"),
        (
            "who sang i will always love you",
            ["Whitney Houston"],
            "Whitney Houston sang I Will Always Love You.",
            "Whitney Houston",
        ),
        (
            "Which planet is known as the Red Planet?",
            ["Mars", "The Red Planet"],
            "Mars, known as the Red Planet.",
            "Mars",
        ),
        (
            "who was the 16th president of the united states",
            ["Abraham Lincoln", "Lincoln"],
            "The 16th president of the United States was Abraham Lincoln.",
            "Abraham Lincoln",
        ),
    ],
)
def test_triviaqa_nq_stay_correct(question, aliases, answer, matched):
    m = match_answer(answer, aliases, question)
    assert m.correct and m.alias == matched and not m.echo_rejected
    assert match_answer(answer, aliases).correct  # correct under plain containment too


def test_choice_options_parse():
    assert choice_options(MARS, "Jupiter") == [["mars"]]
    assert choice_options("Who died first, Leonardo da Vinci or Raphael?", "Raphael") == [
        ["leonardo", "da", "vinci"]
    ]
    assert choice_options(
        "Which is the Oil Capital of China, Chaoyang District, Shantou, or Daqing?", "Daqing"
    ) == [
        ["shantou"],
        ["chaoyang", "district"],
    ]
    assert choice_options("Which planet is known as the Red Planet?", "Red Planet") == []
    assert choice_options("Which Genus has more species Eucryphia or Lepidozamia ?", "Lepidozamia") == [
        ["eucryphia"]
    ]
    # name connectors (text.NAME_CONNECTORS, shared with E_A, so "on" and "for" now join options too)
    town = "Which town is older, Stratford on Avon or Warwick?"
    assert choice_options(town, "Warwick") == [["stratford", "on", "avon"]]
    assert not match_answer("Stratford is older than Warwick.", ["Warwick"], town).correct


def test_label_frame_echo_column_and_count():
    answers = pl.DataFrame(
        {"id": ["a", "b", "c"], "answer": ["Mars is larger than Jupiter.", "Jupiter.", "Saturn"]}
    )
    questions = pl.DataFrame({"id": ["a", "b", "c"], "question": [MARS] * 3, "answers": [["Jupiter"]] * 3})
    out = label_frame(answers, questions)
    assert out["correct"].to_list() == [False, True, False]
    assert out["echo_rejected"].to_list() == [True, False, False]
    acc = accuracy_table(out, "m", "hotpotqa")
    assert acc["n_correct"].item() == 1 and acc["n_echo_rejected"].item() == 1
    # without a question column the rule is off (plain containment)
    old = label_frame(answers, questions.drop("question"))
    assert old["correct"].to_list() == [True, True, False] and not any(old["echo_rejected"])


def test_real_hotpotqa_comparisons(shared_real):
    """Every real comparison question (AMOR dev subset) that offers its gold answer as an option: the gold
    alone is correct, and an answer that names another option first is echo-rejected."""
    rows = [json.loads(line) for line in (shared_real / "hotpotqa" / "amor" / "test.json").open()]
    offered = [
        r
        for r in rows
        if r["type"] == "comparison" and normalize_text(r["answer"]) in normalize_text(r["question"])
    ]
    parsed = 0
    for r in offered:
        q, gold = r["question"], r["answer"]
        options = choice_options(q, gold)
        if not options:
            continue
        parsed += 1
        assert match_answer(gold, [gold], q).correct
        other = " ".join(options[0])
        m = match_answer(f"{other} rather than {gold}", [gold], q)
        assert not m.correct and m.echo_rejected, (q, other)
    assert parsed >= 0.9 * len(offered) and len(offered) >= 40
