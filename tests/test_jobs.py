"""The model rules' shared steps (truthflow.jobs) on a random-weight twin: the job's resources reach the
model load, and the answer table equals generation.answer_questions' answers, column for column."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from truthflow import jobs
from truthflow.generation import answer_questions
from truthflow.twins import build_twin


class Resources(dict):
    """Snakemake's resources: attributes and .get()."""

    __getattr__ = dict.__getitem__


def fake_job(**resources) -> SimpleNamespace:
    params = SimpleNamespace(dtype="float32", attention="efficient", chat=False, max_new_tokens=4,
                             token_budget=None, max_prompt_tokens=64, chat_template_kwargs={})  # fmt: skip
    res = Resources(gpu=0, batch_size=2, **resources)
    return SimpleNamespace(input=SimpleNamespace(model="resources/models/twin"), params=params, resources=res,
                           threads=3)  # fmt: skip


def test_answer_table_is_answer_questions_with_the_rule_params(monkeypatch) -> None:
    lm = build_twin("llama")
    loads = []
    monkeypatch.setattr(jobs, "load_model", lambda *args, **kwargs: loads.append((args, kwargs)) or lm)
    questions = ["What is a thylakoid?", "Who wrote Hamlet?", "Why?"]
    table = jobs.answer_table(fake_job(torch_threads=2), questions, "Answer briefly.", "test")
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


@pytest.mark.model
@pytest.mark.parametrize("fixture", ["smollm_dir", "gemma_dir"])
def test_the_pickled_tokenizer_is_the_one_its_files_build(fixture, request) -> None:
    """prepare_model pickles the tokenizer that load_model would build from the snapshot's files; a job
    unpickles it. Both must tokenize, decode and template alike (a stale pickle would not)."""
    from truthflow.models import _tokenizer, _tokenizer_pickle, _unpickled_tokenizer

    model_dir = request.getfixturevalue(fixture)
    assert _tokenizer_pickle(model_dir).is_file()
    pickled = _unpickled_tokenizer(model_dir)  # what load_pretrained uses, without loading the weights again
    built = _tokenizer(model_dir)
    assert type(pickled) is type(built) and pickled.get_vocab() == built.get_vocab()
    for attr in ("pad_token_id", "eos_token_id", "bos_token_id", "padding_side", "all_special_tokens"):
        assert getattr(pickled, attr) == getattr(built, attr), attr
    assert pickled.chat_template == built.chat_template
    texts = ["Q: Who wrote Carmen?\nA: Georges Bizet", "  naïve café – 東京 \t<b>", ""]
    for text in texts:
        ids = built(text)["input_ids"]
        assert pickled(text)["input_ids"] == ids and pickled.decode(ids) == built.decode(ids)
    if built.chat_template:
        chat = [{"role": "user", "content": texts[0]}]
        template = {"tokenize": False, "add_generation_prompt": True}
        assert pickled.apply_chat_template(chat, **template) == built.apply_chat_template(chat, **template)
