import pytest

from truthflow.exact_tokens import locate, question_spans, short_answer_span
from truthflow.generation import build_prompt, encode_prompt


@pytest.mark.parametrize(
    "answer,expected",
    [
        ("The capital of France is Paris.", "Paris"),
        ("Paris", "Paris"),
        ("It is Barack Obama, the 44th president.", "Barack Obama"),
        ("The answer is: 42\nsome more", "42"),
        ('"Hamlet"', "Hamlet"),
    ],
)
def test_short_answer_span(answer, expected):
    s, e = short_answer_span(answer)
    assert answer[s:e] == expected


def test_short_answer_span_empty():
    assert short_answer_span("...") is None


def test_question_spans_popqa_and_others():
    q = "What is George Rankin's occupation?"
    assert [q[s:e] for s, e in question_spans(q, "popqa", "George Rankin", "occupation")] == [
        "George Rankin",
        "occupation",
    ]
    q = "Which country is the birthplace of the composer of the opera Carmen?"
    assert [q[s:e] for s, e in question_spans(q, "hotpotqa")] == ["Carmen"]
    q = "Are the Eiffel Tower and the Statue of Liberty in the same country?"
    assert [q[s:e] for s, e in question_spans(q, "hotpotqa")] == ["Eiffel Tower", "Statue of Liberty"]
    q = "who wrote the novel pride and prejudice"  # NQ style: no capitals -> content words
    assert [q[s:e] for s, e in question_spans(q, "nq")] == ["wrote", "novel", "pride", "prejudice"]
    q = 'In 1969, who said "one small step"?'
    assert [q[s:e] for s, e in question_spans(q, "triviaqa")] == ["1969", "one small step"]


@pytest.mark.slow
def test_locate_maps_spans_to_tokens(smollm):
    tok = smollm.tokenizer
    question = "What is the capital of France?"
    prompt = build_prompt(tok, question, chat=True)
    prompt_ids = encode_prompt(tok, prompt, chat=True)
    answer_ids = tok(" The capital of France is Paris.", add_special_tokens=False)["input_ids"]
    answer = tok.decode(answer_ids).strip()
    s = answer.index("Paris")
    eq, ea, qpos, reason = locate(
        tok, prompt, prompt_ids, True, question, question_spans(question, "triviaqa"), answer_ids, (s, s + 5)
    )
    assert reason is None
    seq = prompt_ids + answer_ids
    assert tok.decode([seq[i] for i in eq]).strip() == "France"
    assert tok.decode([seq[i] for i in ea]).strip() == "Paris"
    assert all(i in qpos for i in eq)
    *_, reason = locate(tok, prompt, prompt_ids, True, question, [], answer_ids, (s, s + 5))
    assert reason == "eq_not_found"


def test_random_control_positions_are_seeded_and_outside_eq():
    from truthflow.pathways import control_positions

    a = control_positions("s1", [3, 4], list(range(10)), seed=0)
    assert a == control_positions("s1", [3, 4], list(range(10)), seed=0)
    assert len(a) == 2 and not set(a) & {3, 4} and set(a) <= set(range(10))
    assert control_positions("s1", [1, 2, 3], [1, 2, 3, 4], seed=0) == [4]  # fewer left than E_Q has


@pytest.mark.slow
def test_llm_extractor_runs_on_a_real_model(gemma):
    import polars as pl

    from truthflow.generation import generate_answers
    from truthflow.pathways import locate_all

    questions = ["What is the capital of France?", "Who wrote Hamlet?"]
    prompts = [build_prompt(gemma.tokenizer, q, chat=False) for q in questions]
    out = generate_answers(gemma, prompts, 2, 8, stop_at_newline=True, chat=False)
    table = pl.DataFrame(
        {
            "id": ["a", "b"],
            "question": questions,
            "prompt": prompts,
            "answer": [o["answer"] for o in out],
            "prompt_ids": [o["prompt_ids"] for o in out],
            "answer_ids": [o["answer_ids"] for o in out],
            "correct": [False, False],
            "refusal": [False, False],
            "match_start": [None, None],
            "match_end": [None, None],
        }
    )
    kept, dropped = locate_all(gemma, False, "triviaqa", table, extractor="llm", batch_size=2)
    assert (0 if kept is None else kept.height) + dropped.height == 2
