"""Prompt files (truthflow.depth.prompts): the shipped answer prompt is today's prompt, the authors' layout
folds its system text where a template has no system role, every malformed file is one message naming the
config key and the file, and a digest is the sha256 of the file's bytes."""

from __future__ import annotations

import hashlib
import os

import pytest
import yaml
from conftest import REPO

from truthflow.depth import prompts
from truthflow.errors import TruthflowError
from truthflow.generation import build_prompt
from truthflow.twins import build_twin

ANSWER = REPO / "prompts" / "depthqa_answer.yaml"
AUTHORS = REPO / "prompts" / "depthqa_answer_authors_layout.yaml"
JUDGE = REPO / "prompts" / "depthqa_judge.yaml"
QUESTION = "Why does ice float on water?"


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen3", "gemma3"])
@pytest.mark.parametrize("chat", [True, False])
def test_shipped_answer_prompt_is_the_prompt_depthqa_gets_today(arch, chat) -> None:
    """answer_depthqa sends build_prompt(..., instruction=""): the bare question in a chat model's template,
    `Q: ...\\nA:` to a base model."""
    tok = build_twin(arch).tokenizer
    kwargs = {"enable_thinking": False} if arch == "qwen3" else None
    today = build_prompt(tok, QUESTION, chat, instruction="", chat_template_kwargs=kwargs)
    assert prompts.load_answer_prompt(ANSWER).render(tok, QUESTION, chat, kwargs) == today


def test_system_role_is_detected_and_folded_where_a_template_lacks_it() -> None:
    authors = prompts.load_answer_prompt(AUTHORS)
    qwen, mixtral = build_twin("qwen3").tokenizer, build_twin("mixtral").tokenizer
    assert prompts.has_system_role(qwen) and not prompts.has_system_role(mixtral)  # Mixtral's raises
    user = f"\n###Question: \n{QUESTION}\n\n###Answer: "
    assert authors.messages(QUESTION, system_role=True) == [
        {"role": "system", "content": authors.system},
        {"role": "user", "content": user},
    ]
    assert authors.messages(QUESTION, system_role=False) == [
        {"role": "user", "content": f"{authors.system}\n\n{user}"}
    ]
    text = authors.render(mixtral, QUESTION, chat=True)
    assert text == f"<bos>[INST] {authors.system}\n\n{user} [/INST]"
    text = authors.render(qwen, QUESTION, chat=True, chat_template_kwargs={"enable_thinking": False})
    assert text.startswith(f"<|im_start|>system\n{authors.system}<|im_end|>\n<|im_start|>user\n{user}")


def test_a_template_that_drops_or_raises_on_a_system_turn_has_none() -> None:
    tok = build_twin("mistral").tokenizer
    user_turns = "{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]{% endif %}"
    tok.chat_template = "{% for m in messages %}" + user_turns + "{% endfor %}"
    assert not prompts.has_system_role(tok)  # dropped silently
    tok.chat_template = (
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}[INST] {{ m.content }} [/INST]{% endfor %}"
    )
    assert not prompts.has_system_role(tok)
    drop = prompts.AnswerPrompt("Be brief.", "{question}", "drop", "{question}", "x", "0")
    assert drop.render(tok, QUESTION, chat=True) == f"[INST] {QUESTION} [/INST]"
    fold = prompts.AnswerPrompt("Be brief.", "{question}", "fold", "{question}", "x", "0")
    assert fold.render(tok, QUESTION, chat=True) == f"[INST] Be brief.\n\n{QUESTION} [/INST]"


def test_judge_prompt_fills_its_four_fields() -> None:
    judge = prompts.load_judge_prompt(JUDGE)
    text = judge.user("Q?", "A.", "R.")
    assert "###The instruction to evaluate:\nQ?\n\n###Response to evaluate:\nA.\n\n" in text
    assert "###Reference Answer (Score 5):\nR.\n\n###Score Rubrics:\n" + judge.rubric in text
    assert text.endswith("###Feedback: ")


def test_digest_is_the_sha256_of_the_bytes() -> None:
    for path in (ANSWER, AUTHORS, JUDGE):
        expected = hashlib.sha256(path.read_bytes()).hexdigest()
        assert prompts.digest(path) == expected
    assert prompts.load_judge_prompt(JUDGE).sha256 == hashlib.sha256(JUDGE.read_bytes()).hexdigest()


def test_relative_path_is_found_in_the_checkout_from_another_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert prompts.resolve("prompts/depthqa_judge.yaml", "depth.judge.prompt") == JUDGE
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "depthqa_judge.yaml").write_text(JUDGE.read_text())  # the working dir wins
    found = prompts.resolve("prompts/depthqa_judge.yaml", "depth.judge.prompt")
    assert os.path.samefile(found, tmp_path / "prompts" / "depthqa_judge.yaml")


GOOD = yaml.safe_load(ANSWER.read_text())


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (
            {**GOOD, "user": "Answer this."},
            r"'user' must hold \{question\} and no other placeholder, has none",
        ),
        ({**GOOD, "base": "{question} {answer}"}, r"'base' must hold \{question\} and no other placeholder"),
        ({**GOOD, "user": "{question} }"}, r"Single '\}' .*write a literal brace twice"),
        ({**GOOD, "no_system_role": "merge"}, r"'no_system_role' must be one of fold, drop, got 'merge'"),
        ({**GOOD, "kind": "judge"}, r"kind must be 'answer', got 'judge'"),
        ({**GOOD, "extra": 1}, r"unknown key\(s\) \['extra'\]"),
        ({k: v for k, v in GOOD.items() if k != "base"}, r"missing key\(s\) \['base'\]"),
        ({**GOOD, "system": 3}, r"'system' must be text, got int"),
        ("just text", r"must be a mapping"),
    ],
)
def test_bad_answer_prompt_file_is_one_message_naming_key_and_file(tmp_path, content, match) -> None:
    path = tmp_path / "answer.yaml"
    path.write_text(yaml.safe_dump(content))
    with pytest.raises(TruthflowError, match=match) as info:
        prompts.load_answer_prompt(path)
    assert str(info.value).startswith(f"prompt file '{path}' (config key 'depth.prompt')")


def test_bad_judge_prompt_and_missing_file_name_the_key(tmp_path) -> None:
    good = yaml.safe_load(JUDGE.read_text())
    path = tmp_path / "judge.yaml"
    path.write_text(yaml.safe_dump({**good, "task": good["task"].replace("{rubric}", "")}))
    with pytest.raises(
        TruthflowError, match=r"config key 'depth.judge.prompt'\): 'task' must hold \{instruction\}"
    ):
        prompts.load_judge_prompt(path)
    path.write_text("kind: judge\nsystem: [unclosed\n")
    with pytest.raises(TruthflowError, match=r"is not readable YAML"):
        prompts.load_judge_prompt(path)
    with pytest.raises(
        TruthflowError, match=r"^config key 'depth.judge.prompt': prompt file 'nope.yaml' does not"
    ):
        prompts.load_judge_prompt("nope.yaml")


def test_unreadable_prompt_file_is_one_message_naming_key_and_file(tmp_path, monkeypatch) -> None:
    """A file the job may not read (chmod 000; faked here, as root reads any file) is refused at parse time
    in one line, not with a traceback."""
    path = tmp_path / "answer.yaml"
    path.write_text(ANSWER.read_text())
    prompts.load_answer_prompt(path)  # readable: taken
    real = prompts.Path.read_bytes

    def read_bytes(self):
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(prompts.Path, "read_bytes", read_bytes)
    with pytest.raises(
        TruthflowError, match=r"\(config key 'depth.prompt'\) cannot be read: Permission denied$"
    ):
        prompts.load_answer_prompt(path)
