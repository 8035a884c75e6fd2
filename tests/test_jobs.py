"""The model rules' shared steps (truthflow.jobs) on a random-weight twin: the job's resources reach the
model load, and the answer table equals generation.answer_questions' answers, column for column."""

from __future__ import annotations

from types import SimpleNamespace

from truthflow import jobs
from truthflow.generation import answer_questions
from truthflow.twins import build_twin


class Resources(dict):
    """Snakemake's resources: attributes and .get()."""

    __getattr__ = dict.__getitem__


def fake_job(**resources) -> SimpleNamespace:
    params = SimpleNamespace(
        dtype="float32",
        attention="efficient",
        chat=False,
        max_new_tokens=4,
        token_budget=None,
        max_prompt_tokens=64,
        chat_template_kwargs={},
    )
    res = Resources(gpu=0, batch_size=2, **resources)
    return SimpleNamespace(
        input=SimpleNamespace(model="resources/models/twin"), params=params, resources=res, threads=3
    )


def test_answer_table_is_answer_questions_with_the_rule_params(monkeypatch) -> None:
    lm = build_twin("llama")
    loads = []
    monkeypatch.setattr(jobs, "load_model", lambda *args, **kwargs: loads.append((args, kwargs)) or lm)
    questions = ["What is a thylakoid?", "Who wrote Hamlet?", "Why?"]
    table, writer = jobs.answer_table(fake_job(torch_threads=2), questions, "Answer briefly.", "test")
    assert writer.startswith("engine (transformers 5.19.0, torch 2.13.0")  # backend engine: no vLLM
    assert loads == [
        (("resources/models/twin", "float32"), {"gpus": 0, "threads": 2, "attention": "efficient"})
    ]
    assert list(table.schema) == list(jobs.ANSWER_SCHEMA) and table.height == 3
    prompts, out = answer_questions(lm, questions, False, "Answer briefly.", 2, 4, "test", None, 64, {})
    assert table["prompt"].to_list() == prompts
    for column in (
        "answer",
        "prompt_ids",
        "answer_ids",
        "n_new_tokens",
        "prompt_truncated",
        "think_stripped",
    ):
        assert table[column].to_list() == [o[column] for o in out], column


def test_job_model_threads_default_to_the_rule_threads(monkeypatch) -> None:
    loads = []
    monkeypatch.setattr(jobs, "load_model", lambda *args, **kwargs: loads.append(kwargs))
    jobs.load_job_model(fake_job())
    assert loads == [{"gpus": 0, "threads": 3, "attention": "efficient"}]
