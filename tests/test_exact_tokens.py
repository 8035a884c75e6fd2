import json
import re
import statistics
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from truthflow.generation import build_prompt, encode_prompt
from truthflow.pathways.spans import locate, question_spans, short_answer_span

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "answer,question,expected",
    [
        ("The capital of France is Paris.", "What is the capital of France?", "Paris"),
        ("Paris", "What is the capital of France?", "Paris"),
        ("It is Barack Obama, the 44th president.", "Who was the 44th US president?", "Barack Obama"),
        ("The answer is: 42\nsome more", "How many sides has a tetracontakaidigon?", "42"),
        ('"Hamlet"', "Which play did Shakespeare write first?", "Hamlet"),
        # a lowercase connector joins a name ("bin" once only joined choice options in the labels)
        ("It was Osama bin Laden.", "Who founded al-Qaeda?", "Osama bin Laden"),
        ("Al Pacino played him.", "Who played Michael Corleone?", "Al Pacino"),
    ],
)
def test_short_answer_span(answer, question, expected):
    s, e = short_answer_span(answer, question)
    assert answer[s:e] == expected


def test_short_answer_span_empty():
    assert short_answer_span("...", "Who?") is None
    assert short_answer_span("", "Who?") is None


@pytest.mark.parametrize(
    "answer,question,expected",
    [
        # real demo generations (wrong answers) with their questions
        (
            "The Moonlight Sonata was written by Franz Liszt.",
            "What nationality was the composer of the Moonlight Sonata?",
            "Franz Liszt",
        ),
        (
            "The capital of the country whose national football team is Lionel Messi is Manchester",
            "What is the capital of the country whose national football team Lionel Messi captains?",
            "Manchester",
        ),
        ("Mars is larger than Jupiter.", "Which planet is larger, Mars or Jupiter?", "Mars"),
        (
            "Yes, they are from the same country.",
            "Are Fela Kuti and Youssou N'Dour from the same country?",
            "Yes",
        ),
        ("The Titanic sank in 1997.", "what year did the titanic sink", "1997"),
        (
            "The first President of the United States was John F. Kennedy.",
            "Who was the first President of the United States?",
            "John F. Kennedy",
        ),
        (
            "Marie-Louise de la Baume, the first woman to fly solo across the atlantic",
            "who was the first woman to fly solo across the atlantic",
            "Marie-Louise de la Baume",
        ),
        (
            "The Eiffel Tower is the most famous tower in Paris. It was built in",
            "Which French engineer's company built the most famous tower in Paris?",
            "Eiffel Tower",
        ),
        (
            "The freezing point of water is -20 degrees Celsius.",
            "what is the freezing point of water in fahrenheit",
            "-20",
        ),
        ('Singer: "Song of the Ancients" by The Anci', "who sang like a virgin", "Song of the Ancients"),
        (
            "The answer to this question is: The answer is: 24.",
            "how many bones are in the adult human body",
            "24",
        ),
        (
            "Iron is a metal. It is a soft, malleable, and ductile metal.",
            "what is the chemical symbol for iron",
            "metal",
        ),
        (
            "It is a type of vegetable that is often used in cooking",
            "what is the main ingredient in guacamole",
            "vegetable",
        ),
        (
            "The first emperor of rome was named after the god of war, the god of",
            "who was the first emperor of rome",
            "god of war",
        ),
        ("Caterpillars turn into caterpillars.", "What do caterpillars turn into?", "Caterpillars"),
        # a name after a restated relation word wins over an invented subject; titles are dropped
        ("Mohsakal Advani was born in India.", "In what city was Mahatma Gandhi born?", "India"),
        (
            "The mother of Nero is the Roman Emperor Claudius Blackwood.",
            "Who is the mother of Nero?",
            "Claudius Blackwood",
        ),
        ("Louis XIV was the father of King Louis XF.", "Who is the father of Louis XIV?", "Louis XF"),
        (
            "Prince Harry is the mother of the Queen of England.",
            "Who is the mother of Prince Harry?",
            "Queen of England",
        ),
        ("John Smith wrote it in 1990.", "Who wrote The Raven?", "John Smith"),
        # shouted capitals keep their last word (SmolLM2 tokenizes these three words into 11 pieces);
        # initials and numerals are not shouting
        ("BROWN BARBADO OPERA - The birthplace of the", "In what city was Barack Obama born?", "OPERA"),
        (
            "The author of The Hobbit is typically referred to as J.R.R",
            "Who is the author of The Hobbit?",
            "J.R.R",
        ),
        ("Louis XIV was the father of King Louis XF.", "Who is the father of LOUIS XIV?", "Louis XF"),
        # a lowercase answer phrase is its head, the last word; a phrase with a connector stays whole
        (
            "Jonah Lomu is a professional skier who plays a sport called",
            "What sport does Jonah Lomu play?",
            "skier",
        ),
        ("Pikachu is a magical creature with a color of blue.", "What color is Pikachu?", "creature"),
    ],
)
def test_short_answer_span_with_question(answer, question, expected):
    s, e = short_answer_span(answer, question)
    assert answer[s:e] == expected


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
    q = "who wrote the novel pride and prejudice"  # NQ style: no capitals -> subject chunk + property
    assert [q[s:e] for s, e in question_spans(q, "nq")] == ["wrote", "novel", "pride", "prejudice"]
    q = 'In 1969, who said "one small step"?'
    assert [q[s:e] for s, e in question_spans(q, "triviaqa")] == ["1969", "said", "small", "step"]
    q = 'In 1969, who said "One Small Step"?'
    assert [q[s:e] for s, e in question_spans(q, "triviaqa")] == ["1969", "One Small Step"]


@pytest.mark.parametrize(
    "question,expected",
    [
        ("who sang i will always love you", ["sang", "always", "love"]),
        ("when did the eagles win their last super bowl", ["eagles", "super", "bowl"]),
        ("how many episodes in season 2 of the crown", ["episodes", "season", "2", "crown"]),
        ("what year did the titanic sink", ["titanic", "sink"]),
        ("who played big enos in smokey and the bandit", ["played", "smokey", "bandit"]),
        ("when did season 4 of glee come out", ["season", "4", "glee"]),
        ("who had a baby at 100 in the bible", ["baby", "100", "bible"]),
        ("how many seasons of vampire diaries r there", ["seasons", "vampire", "diaries"]),
        # numbers are kept but never alone
        ("what happened in 1066", ["happened", "1066"]),
        # mixed case keeps the capitalized entities (TriviaQA, HotpotQA)
        ("Which Italian composer wrote the opera Aida?", ["Italian", "Aida"]),
        (
            "Who captained the England rugby union team 59 times between 1988 and 1996?",
            ["England", "59", "1988", "1996"],
        ),
        ("What type of animal is a dik-dik?", ["animal", "dik-dik"]),  # no capitals past the first word
        ("What is the square root of 81?", ["square", "root", "81"]),  # only a number -> content words
    ],
)
def test_question_spans_subject_and_property(question, expected):
    assert [question[s:e] for s, e in question_spans(question, "nq")] == expected


def _eq_share(tokenizer, question: str) -> tuple[bool, float]:
    """(E_Q has a non-numeric word, share of question tokens in E_Q), mapped with offsets as `locate`."""
    spans = question_spans(question, "nq")
    offsets = tokenizer(question, return_offsets_mapping=True, add_special_tokens=False)["offset_mapping"]
    eq = {i for s, e in spans for i, (a, b) in enumerate(offsets) if b > s and a < e and b > a}
    return any(re.search(r"[^\W\d_]", question[s:e]) for s, e in spans), len(eq) / len(offsets)


@pytest.mark.model
@pytest.mark.parametrize("model_dir", ["smollm_dir", "gemma_dir"])
def test_nq_open_eq_coverage_and_share(shared_real, model_dir, request):
    """All 3,610 NQ-open dev questions: >= 95% get a non-numeric content word in E_Q and the median share
    of question tokens in E_Q is <= 60% (measured: 100% and 0.40 with SmolLM2's tokenizer, 100% and 0.375
    with Gemma-3's)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(request.getfixturevalue(model_dir))
    lines = (shared_real / "nq_open" / "NQ-open.dev.jsonl").read_text().splitlines()
    stats = [_eq_share(tok, json.loads(line)["question"]) for line in lines]
    assert len(stats) == 3610
    coverage = sum(c for c, _ in stats) / len(stats)
    median = statistics.median(s for _, s in stats)
    assert coverage >= 0.95, coverage
    assert median <= 0.60, median


@pytest.mark.model
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
    from truthflow.pathways.extract import control_positions

    a = control_positions("s1", [3, 4], list(range(10)), seed=0)
    assert a == control_positions("s1", [3, 4], list(range(10)), seed=0)
    assert len(a) == 2 and not set(a) & {3, 4} and set(a) <= set(range(10))
    assert control_positions("s1", [1, 2, 3], [1, 2, 3, 4], seed=0) is None  # fewer left than E_Q has


@pytest.mark.model
def test_llm_extractor_runs_on_a_real_model(gemma, monkeypatch):
    """The real model's copies become spans inside their texts, and locate_spans takes a wrong answer's E_A
    (and E_Q) from the LLM extractor, not from the deterministic fallback."""
    from truthflow.generation import generate_answers
    from truthflow.pathways import extract

    questions = ["What is the capital of France?", "Who wrote Hamlet?"]
    answers = ["The capital of France is Paris.", "Hamlet was written by William Shakespeare."]
    ea, eq = extract.llm_spans(gemma, False, questions, answers, 2)
    for text, span in zip(answers, ea, strict=True):
        assert span is None or (0 <= span[0] < span[1] <= len(text) and text[span[0] : span[1]].strip())
    for text, spans in zip(questions, eq, strict=True):
        assert all(0 <= s < e <= len(text) for s, e in spans)
    assert any(ea) or any(any(x) for x in eq), "the model copied nothing verbatim"

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
    # the extractor's spans (the answer's first word, the question's last word) are what the samples hold
    first = [(0, len(o["answer"].split()[0])) for o in out]
    last = [[(q.rindex(" ") + 1, len(q) - 1)] for q in questions]
    monkeypatch.setattr(extract, "llm_spans", lambda *a, **k: (first, last))
    kept, dropped = extract.locate_spans(gemma, False, "triviaqa", table, extractor="llm", batch_size=2)
    assert dropped.height == 0 and kept.height == 2
    assert kept["ea_text"].to_list() == [o["answer"].split()[0] for o in out]
    assert kept["eq_text"].to_list() == ["France", "Hamlet"]


class CharTokenizer:
    """One token per character (ids are code points): token positions are character positions."""

    def __call__(self, text, add_special_tokens=True, return_offsets_mapping=False):
        return {"input_ids": _ids(text), "offset_mapping": [(i, i + 1) for i in range(len(text))]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def _ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_locate_maps_spans_by_offsets():
    """E_Q through the prompt's offsets, E_A through incremental decoding of the answer, shifted past its
    leading space (the span is in the stripped answer); each reason a sample is dropped for."""
    tok, question = CharTokenizer(), "Capital of France?"
    prompt, answer_ids = f"Q: {question}\nA:", _ids(" It is Paris.")
    args = (tok, prompt, _ids(prompt), True, question, [(11, 17)], answer_ids)
    eq, ea, qpos, reason = locate(*args, (6, 11))
    n = len(prompt)
    assert reason is None and qpos == list(range(3, 21)) and eq == list(range(14, 20))  # "France"
    assert ea == list(range(n + 7, n + 12))  # "Paris": 5 tokens
    assert locate(*args, None)[3] == "ea_not_found"
    assert locate(*args, (40, 45))[3] == "ea_not_found"
    assert locate(*args[:5], [], answer_ids, (6, 11))[3] == "eq_not_found"
    assert locate(tok, prompt, _ids(prompt), True, "Other?", [(0, 5)], answer_ids, (6, 11))[3] == (
        "question_not_in_prompt"
    )
    assert locate(tok, prompt, _ids(prompt)[1:], *args[3:], (6, 11))[3] == "prompt_retokenization_mismatch"


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_shared_run_ea_lengths_comparable(demo_run, model):
    """On the shared run's own samples (the n_ea that extract_pathways wrote): mean |E_A| of wrong answers
    (deterministic extractor, with the question) is at most 1.5x that of correct ones (the matched alias span,
    echo rule on), over its QA sets.

    Pooled per model: one set of 32 is too noisy for a 1.5 bound (random 32-subsets of the demo's SmolLM2
    PopQA answers: 90th percentile 1.79), 64 pooled answers much less (97.5th percentile 1.52 and 1.53 for
    the two models). A regressed extractor is far above it: wrong answers at 6-8.5 tokens against 1.5-2.3."""
    paths = sorted((demo_run / "results" / "demo" / "pathways" / model).glob("*/samples.parquet"))
    s = pl.concat([pl.read_parquet(p, columns=["correct", "n_ea"]) for p in paths])
    wrong, right = s.filter(~pl.col("correct"))["n_ea"], s.filter(pl.col("correct"))["n_ea"]
    assert wrong.len() >= 10 and right.len() >= 10, s
    assert wrong.mean() <= 1.5 * right.mean(), (wrong.mean(), right.mean())


def test_position_only_auc_hand_case():
    from truthflow.pathways.spans import position_only_auc

    correct = np.array([True, True, False, False])
    # wrong |E_A| 3, 2 vs correct 1, 2: pairs (3>1, 3>2, 2>1, 2=2) -> (1 + 1 + 1 + 0.5) / 4 = 0.875
    assert position_only_auc(correct, np.array([1, 2, 3, 2])) == pytest.approx(0.875)
    # the same separation the other way folds to the same value; no separation is 0.5
    assert position_only_auc(correct, np.array([3, 2, 1, 2])) == pytest.approx(0.875)
    assert position_only_auc(correct, np.array([2, 2, 2, 2])) == pytest.approx(0.5)
    assert np.isnan(position_only_auc(np.array([True, True]), np.array([1, 2])))


def test_class_table_reports_the_confound_check():
    import polars as pl

    from truthflow.pathways.spans import class_table

    s = pl.DataFrame(
        {
            "id": ["a", "b", "c", "d"],
            "correct": [True, True, False, False],
            "n_ea": [1, 1, 3, 4],
            "n_eq": [2, 2, 1, 3],
            "question_positions": [[1, 2, 3, 4]] * 4,
            "control_matched": [True, False, True, True],
            "probe_position": [10, 12, 11, 13],
        }
    )
    t = class_table(s, "m", "d")
    assert t["class"].to_list() == ["correct", "wrong"]
    assert t["mean_ea_tokens"].to_list() == [1.0, 3.5]
    assert t["n_no_matched_control"].to_list() == [1, 0]
    assert t["median_eq_share"].to_list() == [0.5, 0.5]
    assert t["auc_ea_length_only"].to_list() == [1.0, 1.0]
    # probe positions: wrong 11, 13 vs correct 10, 12 -> (1 + 0 + 1 + 1) / 4 = 0.75
    assert t["auc_position_only"].to_list() == [0.75, 0.75]


NO_THINK_TEMPLATE = (
    "{% if enable_thinking is defined and not enable_thinking %}[no-think] {% endif %}"
    "{{ messages[0]['content'] }}\nA:"
)


def test_llm_extractor_passes_the_chat_template_kwargs(smollm, monkeypatch):
    """The LLM extractor's prompts go through the model's chat template with the model's
    chat_template_kwargs (Qwen3: enable_thinking false), as the answers did."""
    from truthflow.pathways import extract

    seen: list[str] = []
    real = extract.generate_answers

    def spy(lm, prompts, *args, **kwargs):
        seen.extend(prompts)
        return real(lm, prompts, *args, **kwargs)

    monkeypatch.setattr(extract, "generate_answers", spy)
    monkeypatch.setattr(smollm.tokenizer, "chat_template", NO_THINK_TEMPLATE)
    questions, answers = ["Who wrote Hamlet?"], ["It was Marlowe."]
    extract.llm_spans(smollm, True, questions, answers, 1, {"enable_thinking": False})
    assert len(seen) == 2 and all(p.startswith("[no-think] ") for p in seen)
    seen.clear()
    extract.llm_spans(smollm, True, questions, answers, 1)
    assert len(seen) == 2 and not any("[no-think]" in p for p in seen)
