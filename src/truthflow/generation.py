"""Answers (METHOD A1): base models get `Q: ...\\nA:` and stop at a newline, chat models their template."""

import itertools
import sys
import time
from collections.abc import Callable
from functools import cache

from .engine import Decoding, Tokens, run
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
    if not (chat and getattr(tokenizer, "chat_template", None)):
        return BASE_TEMPLATE.format(question=question)
    content = f"{instruction}\nQuestion: {question}" if instruction else question
    messages = [{"role": "user", "content": content}]
    kwargs = chat_template_kwargs or {}
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)


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
    encode: Callable | None = None,
    limit_name: str | None = None,
) -> tuple[str, list[int], bool]:
    """(prompt, ids, truncated): the longest question prefix within max_prompt_tokens; `render`: a layout,
    `encode`: its tokenization (tokenizer, prompt) -> ids, by default encode_prompt's; `limit_name`: where the
    limit comes from, as an error names it."""
    render = render or (lambda tok, q: build_prompt(tok, q, chat, instruction, chat_template_kwargs))

    def make(q: str) -> tuple[str, list[int]]:
        prompt = render(tokenizer, q)
        return prompt, encode(tokenizer, prompt) if encode else encode_prompt(tokenizer, prompt, chat)

    prompt, ids = make(question)
    if not max_prompt_tokens or len(ids) <= max_prompt_tokens:
        return prompt, ids, False
    lo = _bisect(0, len(question), lambda m: len(make(question[:m].rstrip())[1]) > max_prompt_tokens) - 1
    prompt, ids = make(question[:lo].rstrip())
    if len(ids) > max_prompt_tokens:  # lo = 0: not even the empty question fits
        limit_name = limit_name or f"generation.max_prompt_tokens={max_prompt_tokens}"
        raise TruthflowError(f"the prompt template alone is longer than {limit_name}")
    return prompt, ids, True


def model_context(model) -> int | None:
    """The longest sequence the model's positions cover (its config's max_position_embeddings), None where
    the config names none."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    config = config.get_text_config() if hasattr(config, "get_text_config") else config  # Gemma-3's is nested
    n = getattr(config, "max_position_embeddings", None)
    return int(n) if n else None


def prompt_limit(
    max_prompt_tokens: int | None, context: int | None, max_new_tokens: int
) -> tuple[int | None, str]:
    """(the longest prompt, where that limit comes from): generation.max_prompt_tokens, and within the model's
    context the room an answer of max_new_tokens leaves, whichever is smaller; (None, "") where neither
    applies. The DepthQA authors set no limit (vLLM's max_model_len=None: the model's context)."""
    room = context - max_new_tokens if context else None
    if room is not None and (max_prompt_tokens is None or room < max_prompt_tokens):
        why = f"the model's context of {context:,} tokens less max_new_tokens={max_new_tokens:,}"
        return max(room, 1), why  # 1: a template that does not fit is then one line (fit_prompt)
    if max_prompt_tokens is None:
        return None, ""
    return max_prompt_tokens, f"generation.max_prompt_tokens={max_prompt_tokens}"


@cache
def newline_token_ids(tokenizer) -> list[int]:
    """Ids of every token whose text, decoded alone, holds a newline (A1's base-model stop), in one batch."""
    ids = sorted(tokenizer.get_vocab().values())
    texts = tokenizer.backend_tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)
    return [i for i, text in zip(ids, texts, strict=True) if "\n" in text]


def eos_token_ids(tokenizer, model) -> set[int]:
    """The tokenizer's EOS and every EOS of the model's generation config (chat models end turns with one)."""
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return ({tokenizer.eos_token_id} | set([extra] if isinstance(extra, int) else extra or [])) - {None}


def _bisect(lo: int, hi: int, pred: Callable[[int], bool]) -> int:
    """Smallest k in (lo, hi] with pred(k), for a pred that is monotone and true at hi."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if pred(mid) else (mid, hi)
    return hi


def strip_think(tokenizer, answer_ids: list[int]) -> tuple[list[int], bool]:
    """Drop a reasoning block from a generated answer, on token boundaries, so that E_A character spans map
    onto the kept ids. A leading block (or a lone </think> whose opening tag the prompt wrote) keeps the ids
    after it; an unclosed leading <think> keeps nothing; a block later in the answer cuts the answer there."""

    def upto(k: int) -> str:
        return tokenizer.decode(answer_ids[:k], skip_special_tokens=False)

    def first_with(tag: str) -> int:  # the length of the shortest prefix holding tag
        return _bisect(0, len(answer_ids), lambda k: tag in upto(k))

    text = upto(len(answer_ids))
    open_at, close_at = text.find(THINK_OPEN), text.find(THINK_CLOSE)
    if open_at < 0 and close_at < 0:
        return answer_ids, False
    if open_at < 0 or not text[:open_at].strip() or (0 <= close_at < open_at):  # a leading block
        if close_at < 0:  # unclosed
            return [], True
        return strip_think(tokenizer, answer_ids[first_with(THINK_CLOSE) :])[0], True
    keep = first_with(THINK_OPEN) - 1
    # a tag spread over several tokens leaves its first characters ("<th") in the kept prefix
    while keep > 0 and any(upto(keep).endswith(THINK_OPEN[:j]) for j in range(1, len(THINK_OPEN))):
        keep -= 1
    return answer_ids[:keep], True


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
    send_text: bool = False,
) -> list[dict]:
    """Every prompt (prompt_ids: encoded) decoded by the engine (`Tokens`), or by vLLM where `lm` is a
    `vllm_answers.VllmModel` (send_text: it gets the prompts as text and tokenizes them itself): a dict of
    ANSWER_KEYS each, in order."""
    tok = lm.tokenizer
    encoded = prompt_ids if prompt_ids is not None else [encode_prompt(tok, p, chat) for p in prompts]
    stop_ids = eos_token_ids(tok, lm.model) | set(newline_token_ids(tok) if stop_at_newline else ())
    decoding = decoding or Decoding()
    if getattr(lm, "backend", "engine") == "vllm":
        keys = keys if keys is not None else [str(k + 1) for k in range(len(encoded))]
        new = lm.generate_tokens(
            prompts, encoded, send_text, max_new_tokens, sorted(stop_ids), decoding, keys, desc
        )
    else:
        readout = Tokens(max_new_tokens, sorted(stop_ids), decoding, keys, token_budget)
        new = run(lm, encoded, readout, batch_size, desc=desc)
    results = []
    for prompt, tokens in zip(encoded, new, strict=True):
        ids, think = strip_think(tok, list(itertools.takewhile(lambda t: t not in stop_ids, tokens)))
        text = tok.decode(ids, skip_special_tokens=True).strip()
        results.append(dict(zip(ANSWER_KEYS, (list(prompt), ids, text, len(ids), think), strict=True)))
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
    encode: Callable | None = None,
    ids: list[str] | None = None,
    dataset: str | None = None,
    send_text: bool = False,
) -> tuple[list[str], list[dict]]:
    """Prompt (A1, or `render` and `encode`), truncate to prompt_limit's length, decode, report tokens/s;
    each prompt cut is one line naming its question (`ids`, of `dataset`). send_text: a vLLM `lm` gets the
    prompts as text (the `authors` layout: vLLM's tokenizer call is the layout's tokenization)."""
    limit, why = prompt_limit(max_prompt_tokens, model_context(lm.model), max_new_tokens)
    layout = {"render": render, "encode": encode, "limit_name": why}
    fitted = [
        fit_prompt(lm.tokenizer, q, chat, instruction, limit, chat_template_kwargs, **layout)
        for q in questions
    ]
    prompts, encoded, truncated = ([f[k] for f in fitted] for k in range(3))
    if ids is None:
        ids = [str(k + 1) for k in range(len(questions))]
    of = f" of {dataset}" if dataset else ""
    for qid, question, kept, cut in zip(ids, questions, encoded, truncated, strict=True):
        if cut:  # a cut question is answered from its start alone: say which, so a reader can find it
            what = f"question '{qid}'{of} ({len(question):,} characters)"
            line = f"{desc}: {what} is cut to a prompt of {len(kept):,} tokens to fit {why}"
            print(line, file=sys.stderr, flush=True)
    n_trunc = sum(truncated)
    if n_trunc:
        longest = max(len(q) for q, t in zip(questions, truncated, strict=True) if t)
        print(
            f"{desc}: {n_trunc} of {len(questions)} questions truncated to fit {why} (longest: {longest:,} "
            "characters)",
            file=sys.stderr,
            flush=True,
        )
    t0 = time.perf_counter()
    out = generate_answers(
        lm,
        prompts,
        batch_size,
        max_new_tokens,
        not chat,
        chat,
        desc,
        token_budget,
        encoded,
        decoding,
        keys,
        send_text,
    )
    dt = time.perf_counter() - t0
    for o, t in zip(out, truncated, strict=True):
        o["prompt_truncated"] = t
    n_tok = sum(o["n_new_tokens"] for o in out)
    print(
        f"{desc}: {len(out)} answers, {n_tok} new tokens in {dt:.1f} s ({n_tok / max(dt, 1e-9):.1f} "
        f"tokens/s) on {lm.device}{' by ' + lm.label if getattr(lm, 'backend', '') == 'vllm' else ''}; "
        f"{n_trunc} prompts truncated, {sum(o['think_stripped'] for o in out)} "
        "reasoning blocks stripped",
        file=sys.stderr,
        flush=True,
    )
    return prompts, out
