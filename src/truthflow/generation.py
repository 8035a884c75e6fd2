"""Batched greedy answer generation (base models: `Q: ...\\nA:` with a stop at the first newline)."""

from __future__ import annotations

import sys
import time

from .batching import pad_batch, run_batched
from .models import LoadedModel

BASE_TEMPLATE = "Q: {question}\nA:"
DEFAULT_INSTRUCTION = "Answer the question briefly, in a few words, without explanation."


def build_prompt(tokenizer, question: str, chat: bool, instruction: str = DEFAULT_INSTRUCTION) -> str:
    if chat and getattr(tokenizer, "chat_template", None):
        content = f"{instruction}\nQuestion: {question}" if instruction else question
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )
    return BASE_TEMPLATE.format(question=question)


def encode_prompt(tokenizer, prompt: str, chat: bool) -> list[int]:
    # a chat template already writes its special tokens; a base prompt gets the tokenizer's BOS
    return tokenizer(prompt, add_special_tokens=not chat)["input_ids"]


def newline_token_ids(tokenizer) -> list[int]:
    vocab = tokenizer.get_vocab()
    ids = []
    for tok_id in vocab.values():
        text = tokenizer.decode([tok_id])
        if "\n" in text:
            ids.append(tok_id)
    return sorted(ids)


def generate_answers(
    lm: LoadedModel,
    prompts: list[str],
    batch_size: int,
    max_new_tokens: int,
    stop_at_newline: bool,
    chat: bool,
    desc: str = "generate",
) -> list[dict]:
    """Greedy-decode every prompt; returns, in input order, prompt/answer token ids and the answer text."""
    import torch

    tok, model = lm.tokenizer, lm.model
    encoded = [encode_prompt(tok, p, chat) for p in prompts]
    stop_ids = {tok.eos_token_id} - {None}
    extra_eos = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(extra_eos, int):
        stop_ids.add(extra_eos)
    elif extra_eos:
        stop_ids.update(extra_eos)
    if stop_at_newline:
        stop_ids.update(newline_token_ids(tok))
    stop_list = sorted(stop_ids)
    pad_id = tok.pad_token_id
    results: list[dict | None] = [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
    device = next(model.parameters()).device

    def step(idx: list[int]) -> None:
        input_ids, valid = pad_batch([encoded[i] for i in idx], pad_id, side="left")
        width = input_ids.shape[1]
        attention = valid.long()
        kwargs = {}
        if device.type == "cuda":
            kwargs["cache_implementation"] = "static"
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention.to(device),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                top_p=None,
                top_k=None,
                temperature=None,
                pad_token_id=pad_id,
                eos_token_id=stop_list,
                **kwargs,
            )
        new = out[:, width:].tolist()
        for row, i in enumerate(idx):
            answer_ids = []
            for t in new[row]:
                if t in stop_ids:
                    break
                answer_ids.append(t)
            results[i] = {
                "prompt_ids": encoded[i],
                "answer_ids": answer_ids,
                "answer": tok.decode(answer_ids, skip_special_tokens=True).strip(),
                "n_new_tokens": len(answer_ids),
            }

    run_batched(order, batch_size, step, desc=desc)
    return results  # type: ignore[return-value]


def answer_questions(
    lm: LoadedModel,
    questions: list[str],
    chat: bool,
    instruction: str,
    batch_size: int,
    max_new_tokens: int,
    desc: str,
) -> tuple[list[str], list[dict]]:
    """Prompt (A1: chat template or `Q:/A:` with a newline stop), generate greedily, report new tokens/s."""
    prompts = [build_prompt(lm.tokenizer, q, chat, instruction) for q in questions]
    t0 = time.perf_counter()
    out = generate_answers(
        lm, prompts, batch_size, max_new_tokens, stop_at_newline=not chat, chat=chat, desc=desc
    )
    dt = time.perf_counter() - t0
    n_tok = sum(o["n_new_tokens"] for o in out)
    rate = n_tok / max(dt, 1e-9)
    print(
        f"{desc}: {len(out)} answers, {n_tok} new tokens in {dt:.1f} s ({rate:.1f} tokens/s) on {lm.device}",
        file=sys.stderr,
        flush=True,
    )
    return prompts, out
