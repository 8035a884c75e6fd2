"""What the model rules' scripts share: the rule's model loaded on the job's resources, and its answers."""

import sys
from functools import partial

import polars as pl

from .answer_backend import NAME_KEY, WRITER_KEY
from .generation import answer_questions
from .models import LoadedModel, load_model

ANSWER_SCHEMA = {
    "prompt": pl.String,
    "answer": pl.String,
    "prompt_ids": pl.List(pl.Int64),
    "answer_ids": pl.List(pl.Int64),
    "n_new_tokens": pl.Int64,
    "prompt_truncated": pl.Boolean,
    "think_stripped": pl.Boolean,
}


def load_job_model(sm) -> LoadedModel:
    """input.model with params.dtype and params.attention on the job's GPUs (resources.gpu), torch threads."""
    threads = sm.resources.get("torch_threads") or sm.threads
    p = sm.params
    return load_model(sm.input.model, p.dtype, gpus=sm.resources.gpu, threads=threads, attention=p.attention)


def answer_model(sm):
    """What answers the job's questions: vLLM where params.backend is vllm and vLLM can serve the model here
    (its engine starts on the first answers), else the engine's loaded model; a refusal is one line."""
    p = sm.params
    if getattr(p, "backend", "engine") == "vllm":
        from .vllm_answers import VllmUnavailable, prepare_vllm

        threads = sm.resources.get("torch_threads") or sm.threads
        try:
            return prepare_vllm(sm.input.model, p.dtype, sm.resources.gpu, threads, sm.resources.batch_size)
        except VllmUnavailable as e:
            print(f"{sm.wildcards.model}: the engine answers: {e}", file=sys.stderr, flush=True)
    return load_job_model(sm)


def writer_of(lm) -> str:
    """What generated a job's answers, as tables/inputs.tsv names it: vLLM's build, version and settings, or
    the engine with its transformers and torch."""
    if getattr(lm, "backend", "engine") == "vllm":
        return lm.label
    import torch
    import transformers

    return f"engine (transformers {transformers.__version__}, torch {torch.__version__}, {lm.device})"


def write_answers(table: pl.DataFrame, path, writer: str, name: str) -> None:
    """An answers table with its writer (`writer_of`) and name ("model/dataset") in the Parquet file's
    metadata, where tables/inputs.tsv reads them: the table's own columns stay as they were."""
    table.write_parquet(path, metadata={WRITER_KEY: writer, NAME_KEY: name})


def answer_table(
    sm, questions: list[str], instruction: str, desc: str, **options
) -> tuple[pl.DataFrame, str]:
    """(answers to `questions`, what wrote them: `writer_of`): answer_questions with the rule's params, by
    vLLM or the engine (`answer_model`); `options` go to answer_questions as they are (render, encode: a
    prompt file's layout and its tokenization; send_text: vLLM gets the prompts as text; keys, decoding: the
    sampling; ids, dataset: the questions' names in the line of a prompt cut to fit)."""
    from .vllm_answers import VllmUnavailable

    p = sm.params
    answer = partial(
        answer_questions,
        questions=questions,
        chat=p.chat,
        instruction=instruction,
        batch_size=sm.resources.batch_size,
        max_new_tokens=p.max_new_tokens,
        desc=desc,
        token_budget=p.token_budget,
        max_prompt_tokens=p.max_prompt_tokens,
        chat_template_kwargs=p.chat_template_kwargs,
        **options,
    )
    lm = answer_model(sm)
    try:
        prompts, out = answer(lm)
    except VllmUnavailable as e:  # its engine did not start: nothing was answered yet
        print(f"{sm.wildcards.model}: the engine answers: {e}", file=sys.stderr, flush=True)
        lm = load_job_model(sm)
        prompts, out = answer(lm)
    rows = [{"prompt": prompt, **o} for prompt, o in zip(prompts, out, strict=True)]
    return pl.DataFrame(rows, schema=ANSWER_SCHEMA), writer_of(lm)
