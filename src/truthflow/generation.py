"""Answer generation (METHOD A1): base models get `Q: ...\\nA:` and stop at the first newline, chat models
their chat template; the stop tokens and the reasoning blocks a chat model writes. The decoding itself runs in
the engine (`engine.decoding`)."""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable
from functools import cache

from .engine.decoding import Decoding, decode
from .errors import TruthflowError
from .models import LoadedModel

BASE_TEMPLATE = "Q: {question}\nA:"
DEFAULT_INSTRUCTION = "Answer the question briefly, in a few words, without explanation."
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_KEYS = ("prompt_ids", "answer_ids", "answer", "n_new_tokens", "think_stripped")  # generate_answers'


def build_prompt(
    tokenizer,
    question: str,
    chat: bool,
    instruction: str = DEFAULT_INSTRUCTION,
    chat_template_kwargs: dict | None = None,
) -> str:
    """A1 prompt. chat_template_kwargs go to the chat template (Qwen3: {"enable_thinking": False})."""
    if chat and getattr(tokenizer, "chat_template", None):
        content = f"{instruction}\nQuestion: {question}" if instruction else question
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": content}],
            add_generation_prompt=True,
            tokenize=False,
            **(chat_template_kwargs or {}),
        )
    return BASE_TEMPLATE.format(question=question)


def encode_prompt(tokenizer, prompt: str, chat: bool) -> list[int]:
    # a chat template already writes its special tokens; a base prompt gets the tokenizer's BOS
    return tokenizer(prompt, add_special_tokens=not chat)["input_ids"]


def fit_prompt(
    tokenizer,
    question: str,
    chat: bool,
    instruction: str,
    max_prompt_tokens: int | None,
    chat_template_kwargs: dict | None = None,
    render: Callable | None = None,
) -> tuple[str, list[int], bool]:
    """(prompt, prompt ids, truncated): a prompt over max_prompt_tokens keeps the longest prefix of the
    question that fits (an 18,000-character question otherwise slows its whole batch 20x). render(tokenizer,
    question) -> prompt text replaces `build_prompt` (a prompt file's layout)."""

    def make(q: str) -> tuple[str, list[int]]:
        if render is not None:
            prompt = render(tokenizer, q)
        else:
            prompt = build_prompt(tokenizer, q, chat, instruction, chat_template_kwargs)
        return prompt, encode_prompt(tokenizer, prompt, chat)

    prompt, ids = make(question)
    if not max_prompt_tokens or len(ids) <= max_prompt_tokens:
        return prompt, ids, False
    lo, hi = 0, len(question)  # the longest character prefix whose prompt fits: lo fits, hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if len(make(question[:mid].rstrip())[1]) <= max_prompt_tokens:
            lo = mid
        else:
            hi = mid
    if lo == 0 and len(make("")[1]) > max_prompt_tokens:
        raise TruthflowError(
            f"the prompt template alone is longer than generation.max_prompt_tokens={max_prompt_tokens}"
        )
    prompt, ids = make(question[:lo].rstrip())
    return prompt, ids, True


# ---------------------------------------------------------------- stop tokens


@cache
def newline_token_ids(tokenizer) -> list[int]:
    """Ids of every token whose decoded text holds a newline (the base-model stop of A1): each token decoded
    alone, in one `tokenizers` decode_batch call (Gemma's 262k vocabulary: 0.6 s). Cached per tokenizer."""
    ids = sorted(tokenizer.get_vocab().values())
    texts = tokenizer.backend_tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)
    return [i for i, text in zip(ids, texts, strict=True) if "\n" in text]


def eos_token_ids(tokenizer, model) -> set[int]:
    """The tokenizer's EOS and every EOS of the model's generation config (chat models end turns with one)."""
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return ({tokenizer.eos_token_id} | set([extra] if isinstance(extra, int) else extra or [])) - {None}


# ---------------------------------------------------------------- reasoning blocks


def _first_prefix(tokenizer, ids: list[int], pred: Callable[[str], bool]) -> int:
    """Smallest k with pred(decode(ids[:k])) (binary search: a longer prefix decodes to a longer text)."""
    lo, hi = 0, len(ids)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pred(tokenizer.decode(ids[:mid], skip_special_tokens=False)):
            hi = mid
        else:
            lo = mid
    return hi


def strip_think(tokenizer, answer_ids: list[int]) -> tuple[list[int], bool]:
    """Drop a reasoning block from a generated answer, on token boundaries, so that E_A character spans map
    onto the kept ids. A leading block (or a lone </think> whose opening tag the prompt wrote) keeps the ids
    after it; an unclosed leading <think> keeps nothing; a block later in the answer cuts the answer there."""
    text = tokenizer.decode(answer_ids, skip_special_tokens=False)
    open_at, close_at = text.find(THINK_OPEN), text.find(THINK_CLOSE)
    if open_at < 0 and close_at < 0:
        return answer_ids, False
    leading = open_at < 0 or not text[:open_at].strip() or (0 <= close_at < open_at)
    if leading and close_at >= 0:
        k = _first_prefix(tokenizer, answer_ids, lambda s: THINK_CLOSE in s)
        rest, _ = strip_think(tokenizer, answer_ids[k:])
        return rest, True
    if leading:
        return [], True
    keep = _first_prefix(tokenizer, answer_ids, lambda s: THINK_OPEN in s) - 1
    # a tag spread over several tokens leaves its first characters ("<th") in the kept prefix
    while keep > 0:
        kept = tokenizer.decode(answer_ids[:keep], skip_special_tokens=False)
        if not any(kept.endswith(THINK_OPEN[:j]) for j in range(1, len(THINK_OPEN))):
            break
        keep -= 1
    return answer_ids[:keep], True


# ---------------------------------------------------------------- generation


def generate_answers(
    lm: LoadedModel,
    prompts: list[str],
    batch_size: int,
    max_new_tokens: int,
    stop_at_newline: bool,
    chat: bool,
    desc: str = "generate",
    token_budget: int | None = None,
    prompt_ids: list[list[int]] | None = None,
    decoding: Decoding | None = None,
    keys: list[str] | None = None,
) -> list[dict]:
    """Decode every prompt (prompt_ids: already encoded; `engine.decode`: greedy unless `decoding` samples,
    keys then fix each prompt's draws) in batches of at most batch_size rows and token_budget tokens; with
    stop_at_newline every newline token is an EOS id. Returns, in input order, prompt/answer token ids and
    the answer text."""
    tok = lm.tokenizer
    encoded = prompt_ids if prompt_ids is not None else [encode_prompt(tok, p, chat) for p in prompts]
    stop_ids = eos_token_ids(tok, lm.model)
    if stop_at_newline:
        stop_ids.update(newline_token_ids(tok))
    new = decode(lm, encoded, batch_size, max_new_tokens, stop_ids, token_budget, desc, decoding, keys)
    results = []
    for prompt, tokens in zip(encoded, new, strict=True):
        answer_ids, think = strip_think(tok, list(itertools.takewhile(lambda t: t not in stop_ids, tokens)))
        answer = tok.decode(answer_ids, skip_special_tokens=True).strip()
        row = (list(prompt), answer_ids, answer, len(answer_ids), think)
        results.append(dict(zip(ANSWER_KEYS, row, strict=True)))
    return results


def answer_questions(
    lm: LoadedModel,
    questions: list[str],
    chat: bool,
    instruction: str,
    batch_size: int,
    max_new_tokens: int,
    desc: str,
    token_budget: int | None = None,
    max_prompt_tokens: int | None = None,
    chat_template_kwargs: dict | None = None,
    decoding: Decoding | None = None,
    keys: list[str] | None = None,
    render: Callable | None = None,
) -> tuple[list[str], list[dict]]:
    """Prompt (A1: chat template or `Q:/A:` with a newline stop), decode (greedy unless `decoding` samples,
    each question's draws fixed by its key), report new tokens/s. A question whose prompt exceeds
    max_prompt_tokens is truncated (its answer's `prompt_truncated`). render: as in `fit_prompt`."""
    fitted = [
        fit_prompt(lm.tokenizer, q, chat, instruction, max_prompt_tokens, chat_template_kwargs, render)
        for q in questions
    ]
    prompts = [f[0] for f in fitted]
    n_trunc = sum(f[2] for f in fitted)
    if n_trunc:
        longest = max(len(q) for q, f in zip(questions, fitted, strict=True) if f[2])
        print(
            f"{desc}: {n_trunc} of {len(questions)} questions truncated to fit "
            f"generation.max_prompt_tokens={max_prompt_tokens} (longest: {longest:,} characters)",
            file=sys.stderr,
            flush=True,
        )
    t0 = time.perf_counter()
    ids = [f[1] for f in fitted]
    out = generate_answers(
        lm, prompts, batch_size, max_new_tokens, not chat, chat, desc, token_budget, ids, decoding, keys
    )
    dt = time.perf_counter() - t0
    for o, f in zip(out, fitted, strict=True):
        o["prompt_truncated"] = f[2]
    n_tok = sum(o["n_new_tokens"] for o in out)
    print(
        f"{desc}: {len(out)} answers, {n_tok} new tokens in {dt:.1f} s ({n_tok / max(dt, 1e-9):.1f} "
        f"tokens/s) on {lm.device}; {n_trunc} prompts truncated, {sum(o['think_stripped'] for o in out)} "
        "reasoning blocks stripped",
        file=sys.stderr,
        flush=True,
    )
    return prompts, out
