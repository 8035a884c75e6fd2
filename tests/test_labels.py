import polars as pl

from truthflow.labels import is_refusal, label_frame, match_alias, normalize_text, normalized_words


def test_normalize_hand_cases():
    assert normalize_text("The  U.S. Army!") == "us army"
    assert normalize_text("An apple, a day") == "apple day"
    assert normalize_text("Théâtre") == "théâtre"


def test_normalized_words_keep_character_spans():
    text = "It is The Eiffel-Tower."
    words = normalized_words(text)
    assert [w for w, _, _ in words] == ["it", "is", "eiffeltower"]
    assert text[words[-1][1] : words[-1][2]] == "Eiffel-Tower"


def test_match_alias_span_and_word_boundaries():
    answer = "I think the capital is Paris, France."
    alias, start, end = match_alias(answer, ["paris france", "Lyon"])
    assert alias == "paris france" and answer[start:end] == "Paris, France"
    # containment is by whole words: "5" is not inside "1500"
    assert match_alias("It was built in 1500.", ["5"]) is None
    assert match_alias("", ["Paris"]) is None


def test_longest_alias_wins():
    alias, s, e = match_alias("The United States of America", ["United States", "United States of America"])
    assert alias == "United States of America" and (s, e) == (4, 28)


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
