"""What the model rules' scripts share: the rule's model loaded on the job's resources, and its answers."""

import polars as pl

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


def answer_table(sm, questions: list[str], instruction: str, desc: str, **options) -> pl.DataFrame:
    """Answers to `questions` (answer_questions) with the rule's params; `options` go to answer_questions as
    they are (render, encode: a prompt file's layout and its tokenization; keys, decoding: the sampling;
    ids, dataset: the questions' names in the line of a prompt cut to fit)."""
    p = sm.params
    prompts, out = answer_questions(
        load_job_model(sm),
        questions,
        p.chat,
        instruction,
        sm.resources.batch_size,
        p.max_new_tokens,
        desc=desc,
        token_budget=p.token_budget,
        max_prompt_tokens=p.max_prompt_tokens,
        chat_template_kwargs=p.chat_template_kwargs,
        **options,
    )
    rows = [{"prompt": prompt, **o} for prompt, o in zip(prompts, out, strict=True)]
    return pl.DataFrame(rows, schema=ANSWER_SCHEMA)
