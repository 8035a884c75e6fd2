"""Generation (A1): newline stop ids, token-budget batching, batched = unbatched answers on the demo models,
reasoning blocks stripped on token boundaries, chat-template kwargs, long prompts truncated."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from truthflow.engine.batches import (
    FAKE_OOM_ENV,
    MIN_SHARED_PREFIX,
    common_head,
    next_batch,
    pad_batch,
    run_batched,
)
from truthflow.generation import (
    answer_questions,
    build_prompt,
    encode_prompt,
    eos_token_ids,
    fit_prompt,
    generate_answers,
    newline_token_ids,
    strip_think,
)
from truthflow.pathways.spans import locate

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo"
DEMO_SETS = [
    ("popqa", "popqa/popqa.tsv"),
    ("triviaqa", "triviaqa/validation.jsonl"),
    ("hotpotqa", "hotpotqa/hotpot_dev_distractor_v1.json"),
    ("nq", "nq/NQ-open.dev.jsonl"),
]


def demo_questions(per_set: int = 12) -> list[str]:
    from truthflow.data import load_qa

    out = []
    for name, path in DEMO_SETS:
        df, _ = load_qa(name, {"source": {"local": str(DEMO / path)}, "n": per_set, "seed": 0})
        out += df["question"].to_list()
    return out


def _tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


# ---------------------------------------------------------------- newline stop


@pytest.mark.parametrize("which", ["smollm_dir", "gemma_dir"])
def test_newline_ids_equal_decoding_every_token(which, request):
    tok = _tokenizer(request.getfixturevalue(which))
    ids = sorted(tok.get_vocab().values())
    # every token decoded on its own (one batch_decode call: the same decode, without 262k Python calls)
    reference = [i for i, text in zip(ids, tok.batch_decode([[i] for i in ids]), strict=True) if "\n" in text]
    assert newline_token_ids(tok) == reference
    assert newline_token_ids(tok) is newline_token_ids(tok)  # cached per tokenizer


# ---------------------------------------------------------------- token-budget batching


def test_next_batch_respects_cap_and_token_budget():
    order = [0, 1, 2, 3, 4, 5]
    cost = [10, 10, 20, 20, 40, 90]
    assert next_batch(order, 0, 32, None, None) == order  # no budget: the cap alone
    assert next_batch(order, 0, 3, cost, 1000) == [0, 1, 2]  # the cap still holds
    assert next_batch(order, 0, 32, cost, 60) == [0, 1, 2]  # 3 rows x 20 = 60; a 4th row: 80
    assert next_batch(order, 4, 32, cost, 60) == [4]  # 2 x 90 > 60
    assert next_batch(order, 5, 32, cost, 10) == [5]  # one row always runs, even over budget


def test_run_batched_budget_and_oom_back_off(monkeypatch):
    cost = [4] * 8 + [16] * 4
    seen = []
    run_batched(list(range(12)), 100, seen.append, desc="t", cost=cost, token_budget=32)
    assert seen == [list(range(8)), [8, 9], [10, 11]]
    assert all(len(b) * max(cost[i] for i in b) <= 32 for b in seen)
    monkeypatch.setenv(FAKE_OOM_ENV, "2")
    seen.clear()
    assert run_batched(list(range(12)), 100, seen.append, desc="t", cost=cost, token_budget=32) == 2
    assert [i for b in seen for i in b] == list(range(12)) and max(map(len, seen)) == 2


# ---------------------------------------------------------------- real models


@pytest.mark.model
@pytest.mark.parametrize("which", ["smollm", "gemma"])
def test_batched_answers_equal_unbatched_greedy(which, request):
    """Batching (length-sorted, left-padded, token budget) changes answers by float rounding at most."""
    lm = request.getfixturevalue(which)
    chat = which == "smollm"
    questions = demo_questions(per_set=6)  # 24 real questions, 4 sets: each answer must match
    prompts = [build_prompt(lm.tokenizer, q, chat) for q in questions]
    batched = generate_answers(lm, prompts, 32, 16, stop_at_newline=not chat, chat=chat, token_budget=1024)
    single = generate_answers(lm, prompts, 1, 16, stop_at_newline=not chat, chat=chat)
    differ = [
        (questions[i], single[i]["answer"], batched[i]["answer"])
        for i in range(len(prompts))
        if batched[i]["answer_ids"] != single[i]["answer_ids"]
    ]
    assert len(prompts) == 24
    assert not differ, f"{which}: batched != unbatched for {differ}"


@pytest.mark.model
def test_newline_stop_ends_the_batch_early(gemma, monkeypatch):
    """Newline tokens are EOS ids to generate: a batch ends when all its rows have, not at max_new_tokens."""
    steps = []
    original = gemma.model.generate

    def spy(**kwargs):
        out = original(**kwargs)
        steps.append(out.shape[1] - kwargs["input_ids"].shape[1])
        return out

    monkeypatch.setattr(gemma.model, "generate", spy)
    questions = ["What is the capital of France?", "Who wrote Hamlet?", "What is the largest planet?"]
    prompts = [build_prompt(gemma.tokenizer, q, chat=False) for q in questions]
    out = generate_answers(gemma, prompts, 8, 48, stop_at_newline=True, chat=False)
    assert len(steps) == 1 and steps[0] < 48
    assert steps[0] == max(o["n_new_tokens"] for o in out) + 1  # the longest answer and its newline
    assert all("\n" not in o["answer"] for o in out)


# ---------------------------------------------------------------- reasoning blocks


class PieceTokenizer:
    """Decodes ids by joining the pieces of a fixed vocabulary (a hand-made tokenizer)."""

    def __init__(self, pieces):
        self.pieces = pieces

    def ids(self, *pieces):
        return [self.pieces.index(p) for p in pieces]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.pieces[i] for i in ids)


def test_strip_think_on_token_boundaries():
    tok = PieceTokenizer(
        ["<think>", "</think>", "\n", "Let me", " think", "Paris", " is", " it", "<th", "ink>"]
    )
    # a leading block (closed): the ids after it
    ids = tok.ids("<think>", "\n", "Let me", " think", "\n", "</think>", "\n", "Paris")
    kept, stripped = strip_think(tok, ids)
    assert stripped and kept == tok.ids("\n", "Paris") and tok.decode(kept).strip() == "Paris"
    # unclosed: the model never answered
    assert strip_think(tok, tok.ids("<think>", "Let me", " think")) == ([], True)
    # a lone closing tag (the prompt opened the block)
    assert strip_think(tok, tok.ids(" think", "</think>", "Paris")) == (tok.ids("Paris"), True)
    # a block later in the answer cuts the answer before it, also when the tag spans several tokens
    assert strip_think(tok, tok.ids("Paris", " is", " it", "<think>", " think")) == (
        tok.ids("Paris", " is", " it"),
        True,
    )
    assert strip_think(tok, tok.ids("Paris", "<th", "ink>", " think")) == (tok.ids("Paris"), True)
    # no tags: untouched
    assert strip_think(tok, tok.ids("Paris", " is")) == (tok.ids("Paris", " is"), False)


def test_stripped_answer_keeps_ea_spans_on_its_tokens(smollm_dir):
    """The kept ids decode to the labelled answer, so an E_A span in it maps to those very tokens."""
    tok = _tokenizer(smollm_dir)
    question = "What is the capital of France?"
    prompt = build_prompt(tok, question, chat=True)
    prompt_ids = encode_prompt(tok, prompt, chat=True)
    raw = tok(
        "<think>\nThe capital of France... it is Paris.\n</think>\n\nParis is the capital.",
        add_special_tokens=False,
    )["input_ids"]
    kept, stripped = strip_think(tok, raw)
    answer = tok.decode(kept, skip_special_tokens=True).strip()
    assert stripped and answer == "Paris is the capital."
    eq, ea, _, reason = locate(tok, prompt, prompt_ids, True, question, [(23, 29)], kept, (0, 5))
    assert reason is None
    assert tok.decode([kept[p - len(prompt_ids)] for p in ea]).strip() == "Paris"


def test_chat_template_kwargs_reach_the_template(smollm_dir):
    tok = copy.deepcopy(_tokenizer(smollm_dir))
    tok.chat_template = (
        "{% for m in messages %}<|user|>{{ m['content'] }}\n{% endfor %}<|assistant|>"
        "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    )
    off = build_prompt(tok, "Who wrote Hamlet?", True, "", {"enable_thinking": False})
    on = build_prompt(tok, "Who wrote Hamlet?", True, "")
    assert off == "<|user|>Who wrote Hamlet?\n<|assistant|><think>\n\n</think>\n\n"
    assert on == "<|user|>Who wrote Hamlet?\n<|assistant|>"


# ---------------------------------------------------------------- long prompts


@pytest.mark.parametrize("chat", [False, True])
def test_long_question_is_truncated_to_max_prompt_tokens(smollm_dir, chat):
    tok = _tokenizer(smollm_dir)
    question = "Which of these is the longest river " + "and the widest lake " * 900 + "in Africa?"
    assert len(question) > 18_000
    prompt, ids, truncated = fit_prompt(tok, question, chat, "Answer briefly.", 512)
    assert truncated and 500 <= len(ids) <= 512 and ids == encode_prompt(tok, prompt, chat)
    assert question[:200] in prompt and "in Africa?" not in prompt
    assert prompt.endswith("\nA:") if not chat else prompt.endswith("assistant\n")
    short = fit_prompt(tok, "Who wrote Hamlet?", chat, "Answer briefly.", 512)
    assert short[2] is False and short[0] == build_prompt(tok, "Who wrote Hamlet?", chat, "Answer briefly.")
    assert fit_prompt(tok, question, chat, "Answer briefly.", None)[2] is False  # null: no limit


@pytest.mark.model
def test_answer_questions_counts_truncated_prompts(gemma, capsys):
    questions = ["Who wrote Hamlet?", "Name the river " + "that flows past the old mill " * 700 + "?"]
    prompts, out = answer_questions(gemma, questions, False, "", 4, 4, desc="trunc", max_prompt_tokens=64)
    assert [o["prompt_truncated"] for o in out] == [False, True]
    assert len(out[1]["prompt_ids"]) <= 64 and prompts[1].startswith("Q: Name the river")
    assert "1 of 2 questions truncated to fit generation.max_prompt_tokens=64" in capsys.readouterr().err


def test_a_cut_prompt_is_one_line_naming_its_question(capsys):
    """Each question whose prompt is cut to fit is named (dataset, id) in a line of its own, the others in
    none."""
    from truthflow.twins import build_twin

    lm = build_twin("llama")  # one token per byte
    questions = ["Who wrote Hamlet?", "Name the river " + "that flows past the old mill " * 30 + "?"]
    ids = ["q_short", "q_long"]
    desc = "generate twin/nq"
    _, out = answer_questions(
        lm, questions, False, "", 2, 4, desc, max_prompt_tokens=64, ids=ids, dataset="nq"
    )
    assert [o["prompt_truncated"] for o in out] == [False, True] and len(out[1]["prompt_ids"]) <= 64
    cut = [line for line in capsys.readouterr().err.splitlines() if "is cut to" in line]
    what = f"question 'q_long' of nq ({len(questions[1]):,} characters)"
    kept = len(out[1]["prompt_ids"])
    assert cut == [
        f"{desc}: {what} is cut to a prompt of {kept} tokens to fit generation.max_prompt_tokens=64"
    ]


def test_no_prompt_limit_leaves_the_model_context_as_the_only_cap(capsys):
    """generation.max_prompt_tokens: null (the paper configs, as the DepthQA authors' vLLM with
    max_model_len=None): a prompt of 600 tokens, which the default 512 would cut, is kept whole; one that
    would not leave an answer room in the model's context is cut to fit it, and named."""
    from truthflow.twins import build_twin

    question = "Name the river " + "that flows past the old mill " * 20 + "?"
    lm = build_twin("llama")  # a context of 4,096 positions
    _, default = answer_questions(lm, [question], False, "", 1, 4, "t", max_prompt_tokens=512, ids=["q"])
    _, whole = answer_questions(lm, [question], False, "", 1, 4, "t", max_prompt_tokens=None, ids=["q"])
    assert default[0]["prompt_truncated"] and len(default[0]["prompt_ids"]) <= 512
    assert not whole[0]["prompt_truncated"] and len(whole[0]["prompt_ids"]) > 600
    capsys.readouterr()
    short = build_twin("llama", max_position_embeddings=300)
    _, out = answer_questions(short, [question], False, "", 1, 4, "t", None, None, ids=["q"], dataset="nq")
    # 300 positions less 4 new tokens: the prompt keeps at most 296
    assert out[0]["prompt_truncated"] and 280 <= len(out[0]["prompt_ids"]) <= 296
    err = capsys.readouterr().err
    assert "t: question 'q' of nq (" in err
    assert "to fit the model's context of 300 tokens less max_new_tokens=4" in err


@pytest.mark.model
def test_shared_head_generation_equals_plain_generate(gemma, monkeypatch):
    """Prompts that share a long head (prefilled once, repeated for the batch) get the answers of plain
    batched `generate` on the whole prompts, also where the model's generation config names a cache
    implementation of its own (Gemma-3 on the hub: "hybrid"), which a given cache would otherwise refuse."""
    import torch

    head = "Answer each question with a short phrase, a name or a number. Be brief. "
    questions = ["What is the capital of France?", "Who wrote Hamlet?", "What is the largest planet?", "2+2?"]
    prompts = [build_prompt(gemma.tokenizer, head + q, chat=False) for q in questions]
    encoded = [encode_prompt(gemma.tokenizer, p, False) for p in prompts]
    assert common_head(encoded, 100) >= MIN_SHARED_PREFIX
    monkeypatch.setattr(gemma.model.generation_config, "cache_implementation", "hybrid")
    calls = []
    original = gemma.model.generate

    def spy(**kwargs):
        calls.append("past_key_values" in kwargs)
        return original(**kwargs)

    monkeypatch.setattr(gemma.model, "generate", spy)
    got = generate_answers(gemma, prompts, 8, 12, stop_at_newline=True, chat=False)
    assert calls == [True]  # one batch, prefilled from the shared head
    ids, valid = pad_batch(encoded, gemma.tokenizer.pad_token_id, side="left")
    with torch.inference_mode():
        ref = original(
            input_ids=ids,
            attention_mask=valid.long(),
            max_new_tokens=12,
            do_sample=False,
            top_p=None,
            top_k=None,
            temperature=None,
            pad_token_id=gemma.tokenizer.pad_token_id,
            cache_implementation="dynamic",
        )[:, ids.shape[1] :].tolist()
    stops = eos_token_ids(gemma.tokenizer, gemma.model) | set(newline_token_ids(gemma.tokenizer))
    for row, out in zip(ref, got, strict=True):
        cut = next((k for k, t in enumerate(row) if t in stops), len(row))
        assert out["answer_ids"] == row[:cut]


@pytest.mark.model
def test_sampled_answers_of_a_demo_model_do_not_depend_on_the_batch(smollm):
    """DepthQA-style chat prompts to SmolLM2, sampled as the authors did (temperature 1, top-p 0.9, repetition
    penalty 1.03): batches of 1, 7 and 32 give the same answers, each fixed by its question id."""
    from truthflow.engine.decoding import Decoding

    questions = [
        f"Why does {x} matter in {y}?"
        for x in ("entropy", "a proton gradient", "inflation")
        for y in ("physics", "biology", "economics")
    ]
    prompts = [build_prompt(smollm.tokenizer, q, chat=True, instruction="") for q in questions]
    keys = [f"d{i}" for i in range(len(prompts))]
    sampled = Decoding(temperature=1.0, top_p=0.9, repetition_penalty=1.03, seed=42)

    def run(batch):
        out = generate_answers(smollm, prompts, batch, 8, False, True, decoding=sampled, keys=keys)
        return [o["answer_ids"] for o in out]

    one = run(1)
    assert run(7) == one and run(32) == one
    assert len({tuple(a) for a in one}) == len(one)  # different questions, different draws


def test_gguf_tokenizer_adds_the_bos_its_metadata_names(gemma_dir):
    """Gemma-3's GGUF says `tokenizer.ggml.add_bos_token: true`; transformers 5.19's GGUF converter drops it,
    and the demo's Gemma then answered every base prompt with a bare newline. The prepared snapshot's
    tokenizer starts a plain encoding with BOS, as the GGUF's metadata names it."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gemma_dir)
    ids = tok("Q: Who wrote Hamlet?\nA:")["input_ids"]
    assert ids[0] == tok.bos_token_id == 2 and ids.count(2) == 1
