"""The DepthQA authors' answer layout (depth.prompt_layout: authors), token for token: one question rendered
and tokenized for three chat templates, against id sequences written out here. The authors fold the system
text into the user turn after one newline where the template's text lacks the string "system" (Llama-3,
Mixtral), strip the rendered prompt, and their vLLM tokenized the text with the tokenizer's special tokens,
so the BOS the template writes comes twice."""

from __future__ import annotations

import pytest

from truthflow.depth import prompts
from truthflow.errors import TruthflowError
from truthflow.generation import fit_prompt
from truthflow.twins import TEMPLATES, build_tokenizer

# Meta-Llama-3-8B-Instruct's template: no "system" anywhere in its text, each turn's content trimmed
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# Llama-2-7b-chat-hf's template: a system turn becomes <<SYS>> lines in the first [INST]
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
# the twin tokenizer's ids (twins.build_tokenizer): its special tokens first, then one token per byte
BOS, INST, END_INST, HEADER, END_HEADER, EOT = 1, 7, 8, 9, 10, 11
PROMPT = prompts.AnswerPrompt(
    system="Be honest.",
    user="\n###Question: \n{question}\n\n###Answer: ",
    no_system_role="fold",
    base="{question}",
    path="test",
    sha256="0",
)
QUESTION = "Why?"


def text_ids(text: str) -> list[int]:
    """GPT-2's byte alphabet after the 12 special tokens: printable bytes ! to ~ first, then bytes 0-32."""
    return [12 + b - 33 if 33 <= b <= 126 else 200 + b for b in text.encode()]


def twin(template: str):
    tok = build_tokenizer("llama")  # BOS "<bos>", added by a plain encoding
    tok.chat_template = template
    return tok


# one question per template: the rendered prompt and its ids, both written out by hand
CASES = {
    # no "system" in the template: folded after ONE newline, trimmed by the template, the last "\n\n" stripped
    "llama-3": (
        LLAMA3,
        "<bos><|start_header_id|>user<|end_header_id|>\n\nBe honest.\n\n###Question: \nWhy?\n\n###Answer:"
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>",
        [BOS, BOS, HEADER, *text_ids("user"), END_HEADER]
        + text_ids("\n\nBe honest.\n\n###Question: \nWhy?\n\n###Answer:")
        + [EOT, HEADER, *text_ids("assistant"), END_HEADER],
    ),
    # a system role: the system text in <<SYS>> lines, the user turn after it
    "llama-2-chat": (
        LLAMA2,
        "<bos>[INST] <<SYS>>\nBe honest.\n<</SYS>>\n\n\n###Question: \nWhy?\n\n###Answer: [/INST]",
        [BOS, BOS, INST, *text_ids(" <<SYS>>\nBe honest.\n<</SYS>>\n\n\n###Question: \nWhy?\n\n###Answer: ")]
        + [END_INST],
    ),
    # refuses a system turn, and its text lacks "system": folded; the user turn's closing space is kept
    "mixtral": (
        TEMPLATES["mixtral"],
        "<bos>[INST] Be honest.\n\n###Question: \nWhy?\n\n###Answer:  [/INST]",
        [BOS, BOS, INST, *text_ids(" Be honest.\n\n###Question: \nWhy?\n\n###Answer:  "), END_INST],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_authors_layout_token_for_token(name: str) -> None:
    template, text, ids = CASES[name]
    tok = twin(template)
    assert ("system" in template) == (name == "llama-2-chat")
    rendered = PROMPT.render(tok, QUESTION, chat=True, layout="authors")
    assert rendered == text
    assert prompts.vllm_encode(tok, rendered) == ids
    # the path answer_depthqa takes: render, then encode, with no truncation
    render = lambda t, q: PROMPT.render(t, q, True, None, "authors")  # noqa: E731
    assert fit_prompt(tok, QUESTION, True, "", None, render=render, encode=prompts.vllm_encode) == (
        text,
        ids,
        False,
    )


def test_truthflow_layout_differs_where_the_authors_fold() -> None:
    """On Llama-3's template truthflow finds a system role by rendering one, and the template's BOS is the
    only one; the authors fold, and their BOS is doubled."""
    tok = twin(LLAMA3)
    ours = PROMPT.render(tok, QUESTION, chat=True)
    assert ours.startswith("<bos><|start_header_id|>system<|end_header_id|>\n\nBe honest.<|eot_id|>")
    assert ours.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    ids = fit_prompt(tok, QUESTION, True, "", None, render=lambda t, q: PROMPT.render(t, q, True))[1]
    assert ids[:3] == [BOS, HEADER, *text_ids("s")]


def test_authors_layout_where_their_code_failed_is_one_line() -> None:
    """Gemma's template names "system" and refuses a system turn: their code gave it one and failed."""
    tok = twin(
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
        "supported') }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    with pytest.raises(TruthflowError) as info:
        PROMPT.render(tok, QUESTION, chat=True, layout="authors")
    message = str(info.value)
    assert message.startswith("depth.prompt_layout 'authors': the chat template refuses the turns system + ")
    assert message.endswith("System role not supported") and "\n" not in message


def test_authors_layout_empty_system_text_and_base_prompt() -> None:
    """An empty system text still makes a system turn (or a leading newline when folded), as in their code;
    a model without a chat template gets `base`, stripped."""
    bare = prompts.AnswerPrompt("", "{question}", "fold", "  Q: {question}\nA: ", "test", "0")
    assert bare.authors_messages(QUESTION, LLAMA2) == [
        {"role": "system", "content": ""},
        {"role": "user", "content": QUESTION},
    ]
    assert bare.authors_messages(QUESTION, LLAMA3) == [{"role": "user", "content": "\n" + QUESTION}]
    assert bare.render(twin(LLAMA3), QUESTION, chat=False, layout="authors") == "Q: Why?\nA:"
    with pytest.raises(TruthflowError, match="prompt_layout must be one of truthflow, authors, got 'x'"):
        bare.render(twin(LLAMA3), QUESTION, chat=True, layout="x")
