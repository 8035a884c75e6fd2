"""Judges that score an answer 1–5 against a reference answer (METHOD B3), with an append-only verdict cache.
Backends: `reference` (token-F1, offline, deterministic), `openai` (any OpenAI-compatible chat endpoint) and
`hf` (a local transformers model); the LLM backends share one absolute-grading rubric prompt in the style of
DepthQA / Prometheus: feedback, then `[RESULT] <1-5>`.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import polars as pl
from tqdm.auto import tqdm

from ..config import schema_defaults
from ..errors import TruthflowError
from ..redact import add_secret, redact
from ..text import normalize_text

REFERENCE_MODEL = "token-f1"
JUDGE_DEFAULTS: dict = schema_defaults("depth", "judge")
OPENAI_WORKERS = 4  # requests in flight
# bump when parse_verdict reads a text differently: cached verdicts of the old parser are then asked again
PARSER_VERSION = 1

SYSTEM_PROMPT = (
    "You are a fair judge. You give clear, objective feedback on a response and grade it strictly by the "
    "score rubric you are given."
)

RUBRIC = """[Is the response correct, accurate and factual?]
Score 1: Mostly wrong or not factual; it misunderstands the question or topic.
Score 2: Partly right, with serious factual errors or inaccuracies.
Score 3: Broadly right and factual, with minor errors or missing detail.
Score 4: Right, accurate and factual, with only small omissions or slips that do not matter much.
Score 5: Entirely right, accurate and factual, as complete and precise as the reference answer."""

PROMPT_TEMPLATE = """###Task Description:
You are given an instruction, a response to evaluate, a reference answer that would get a score of 5, and a \
score rubric with the criterion to grade on.
1. Write feedback that judges the response strictly by the score rubric, not by general quality.
2. Then give a score, an integer from 1 to 5, by the score rubric.
3. Use this output format: "Feedback: (your feedback) [RESULT] (an integer from 1 to 5)"
4. Write nothing else: no opening, closing or extra explanation. End with [RESULT] <1-5>.

###The instruction to evaluate:
{instruction}

###Response to evaluate:
{response}

###Reference Answer (Score 5):
{reference}

###Score Rubrics:
{rubric}

###Feedback: """

_RESULT = re.compile(
    r"\[RESULT\]\s*:?\s*(?:score\s*(?:of)?\s*:?\s*|result\s*:?\s*)?[(\[]?\s*([1-5])(?![0-9.])", re.IGNORECASE
)
_INTEGER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])")


@dataclass
class Verdict:
    score: int | None
    reason: str
    raw: str | None = None


# ---------------------------------------------------------------- reference backend (token F1)


def token_f1(prediction: str, reference: str) -> float:
    pred, ref = normalize_text(prediction).split(), normalize_text(reference).split()
    if not pred or not ref:
        return float(pred == ref)  # SQuAD: two empty strings agree, one empty string scores 0
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def f1_to_score(f1: float) -> int:
    """1 + round(4·F1), rounding halves up (Python's round() would send 2.5 to 2)."""
    return 1 + math.floor(4 * f1 + 0.5)


# ---------------------------------------------------------------- LLM verdicts


def build_rubric_prompt(question: str, answer: str, reference: str) -> str:
    return PROMPT_TEMPLATE.format(instruction=question, response=answer, reference=reference, rubric=RUBRIC)


def parse_verdict(text: str | None) -> int | None:
    """The score after the last `[RESULT]`; else the only number in the text when it is an integer 1–5."""
    if not text:
        return None
    found = _RESULT.findall(text)
    if found:
        return int(found[-1])
    numbers = _INTEGER.findall(text)
    if len(numbers) == 1 and numbers[0] in {"1", "2", "3", "4", "5"}:
        return int(numbers[0])
    return None


def read_verdict(text: str | None) -> Verdict:
    """The score and the feedback before `[RESULT]`; an unparseable text is a verdict without a score."""
    score = parse_verdict(text)
    if score is None:
        return Verdict(None, f"unparseable verdict: {(text or '').strip()[:80]}", text)
    head = re.split(r"\[RESULT\]", text, flags=re.IGNORECASE)[0]
    return Verdict(score, re.sub(r"^\s*feedback\s*:\s*", "", head, flags=re.IGNORECASE).strip(), text)


# ---------------------------------------------------------------- settings and backends


def judge_settings(cfg: Mapping) -> dict:
    return {**JUDGE_DEFAULTS, **cfg}


def judge_model_name(cfg: Mapping) -> str:
    backend = cfg.get("backend", "reference")  # one of the schema's enum
    if backend == "reference":
        return REFERENCE_MODEL
    if not cfg.get("model"):
        raise TruthflowError(
            f"depth.judge.backend '{backend}' needs depth.judge.model (the judge model's name, dir or id)"
        )
    return str(cfg["model"])


def check_judge_config(judge_cfg: Mapping, environ: Mapping[str, str]) -> None:
    """Raise TruthflowError, naming the config key or variable, when the judge cannot run as configured."""
    settings = judge_settings(judge_cfg)
    judge_model_name(settings)
    key_env = settings["api_key_env"]
    if settings["backend"] == "openai" and key_env and not environ.get(key_env):
        raise TruthflowError(
            f"depth.judge.backend 'openai' needs an API key, but ${key_env} is not set "
            f"(depth.judge.api_key_env: {key_env}): export {key_env}=<key>, or set depth.judge.api_key_env "
            f"to the variable that holds it (null for an endpoint that takes no key)"
        )


class ReferenceJudge:
    def __init__(self, cfg: Mapping) -> None:
        self.cfg = cfg

    def verdicts(self, rows: list[dict]) -> Iterator[tuple[int, Verdict]]:
        for i, row in enumerate(rows):
            f1 = token_f1(row["answer"], row["reference"])
            yield i, Verdict(f1_to_score(f1), f"token-F1 {f1:.3f}")


def _one_line(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return redact(" ".join(str(text).split()))[:200]


class OpenAIJudge:
    """Chat completions at any OpenAI-compatible endpoint (`openai` SDK), rubric prompt, temperature 0. The
    SDK retries a network error, a timeout, HTTP 408/409/429 and 5xx `retries` times; any other error (401,
    400, an unknown model) stops the job with one line naming the endpoint and the status."""

    def __init__(self, cfg: Mapping) -> None:
        import openai

        settings = judge_settings(cfg)
        check_judge_config(settings, os.environ)
        self.model, self.key_env = str(settings["model"]), settings["api_key_env"]
        key = os.environ[self.key_env] if self.key_env else None
        add_secret(key)
        self.client = openai.OpenAI(
            # a placeholder, never None: with None the SDK would send $OPENAI_API_KEY to a keyless endpoint
            api_key=key or "no-key",
            base_url=settings["base_url"] or None,  # None: $OPENAI_BASE_URL, else api.openai.com
            max_retries=int(settings["retries"]),
            timeout=float(settings["timeout_s"]),
        )
        self.url = str(self.client.base_url).rstrip("/") + "/chat/completions"
        self.max_new_tokens = int(settings["max_new_tokens"])
        self.tries = int(settings["retries"]) + 1
        self.openai, self.failed = openai, None
        for name in ("httpx", "httpx2", "httpcore"):  # no line per request in the rule log
            logging.getLogger(name).setLevel(logging.WARNING)

    def _error(self, exc: Exception) -> TruthflowError:
        if isinstance(exc, self.openai.APIStatusError):
            status = exc.status_code
            if status in (408, 409, 429) or status >= 500:  # the statuses the SDK retries
                head = f"still answers HTTP {status} after {self.tries} tries"
            else:
                head = f"answered HTTP {status} (not retried)"
                if status in (401, 403):
                    head += f"; check the key in ${self.key_env}" if self.key_env else "; it wants an API key"
                elif status == 404:
                    head += "; check depth.judge.model and depth.judge.base_url"
            body = exc.body if exc.body is not None else exc.response.text
            if isinstance(body, dict) and isinstance(body.get("message"), str):
                body = body["message"]  # an OpenAI-style {"error": {"message": ...}}
            return TruthflowError(f"judge endpoint {self.url} {head}: {_one_line(body)}")
        if isinstance(exc, self.openai.APIConnectionError):  # timeouts included
            return TruthflowError(
                f"judge endpoint {self.url} is unreachable after {self.tries} tries "
                f"({_one_line(exc.__cause__ or exc)}); check depth.judge.base_url"
            )
        return TruthflowError(f"judge endpoint {self.url} gave an unusable answer: {_one_line(str(exc))}")

    def one(self, row: dict) -> Verdict:
        if self.failed:  # another request hit an error no retry cures: a worker free now asks nothing more
            raise self.failed
        prompt = build_rubric_prompt(row["question"], row["answer"], row["reference"])
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": prompt}]
        try:
            reply = self.client.chat.completions.create(
                model=self.model, messages=messages, temperature=0, max_tokens=self.max_new_tokens
            )
        except self.openai.OpenAIError as exc:
            self.failed = self._error(exc)
            raise self.failed from None
        try:
            return read_verdict(reply.choices[0].message.content)
        except (AttributeError, IndexError, TypeError):  # the SDK does not check a reply's shape
            self.failed = TruthflowError(
                f"judge model '{self.model}' at {self.url} answered without choices[0].message.content: "
                f"{_one_line(reply)}"
            )
            raise self.failed from None

    def verdicts(self, rows: list[dict]) -> Iterator[tuple[int, Verdict]]:
        pool = ThreadPoolExecutor(max_workers=OPENAI_WORKERS)
        try:
            futures = {pool.submit(self.one, row): i for i, row in enumerate(rows)}
            # as they finish, so a slow request never holds finished verdicts out of the cache
            for future in as_completed(futures):
                yield futures[future], future.result()
        finally:  # an error stops the job: the queued requests are never sent
            pool.shutdown(wait=True, cancel_futures=True)


class HFJudge:
    """A local transformers model with the rubric prompt, greedy. Greedy repeats itself, so no retries."""

    def __init__(self, cfg: Mapping) -> None:
        self.settings = judge_settings(cfg)
        self.model_id = judge_model_name(self.settings)
        self.batch_size = int(self.settings["batch_size"])
        self.max_new_tokens = int(self.settings["max_new_tokens"])
        self.lm = self._load()
        self.chat = bool(getattr(self.lm.tokenizer, "chat_template", None))

    def _load(self):
        from ..models import INFO_FILE, LoadedModel, load_model, load_pretrained

        dtype = str(self.settings["dtype"])
        path = Path(self.model_id)
        if (path / INFO_FILE).exists():
            return load_model(path, dtype)
        try:  # a hub id or a plain directory: the same device assignment as the model jobs
            model, tokenizer, device = load_pretrained(self.model_id, dtype)
        except OSError as exc:
            raise TruthflowError(
                f"depth.judge.model '{self.model_id}' cannot be loaded (dir or hub id?): "
                f"{_one_line(str(exc))}"
            ) from None
        return LoadedModel(model=model, tokenizer=tokenizer, info={"name": self.model_id}, device=device)

    def _prompt(self, row: dict) -> str:
        from ..generation import build_prompt

        # some chat templates (Gemma) reject a system turn, so the system text leads the user turn
        content = (
            SYSTEM_PROMPT + "\n\n" + build_rubric_prompt(row["question"], row["answer"], row["reference"])
        )
        if not self.chat:
            return content
        kwargs = dict(self.settings["chat_template_kwargs"] or {})
        # a template with a thinking switch (Qwen3) thinks by default, past max_new_tokens before any verdict:
        # off unless the config says otherwise
        if "enable_thinking" in str(self.lm.tokenizer.chat_template):
            kwargs.setdefault("enable_thinking", False)
        return build_prompt(self.lm.tokenizer, content, chat=True, instruction="", template_kwargs=kwargs)

    def verdicts(self, rows: list[dict]) -> Iterator[tuple[int, Verdict]]:
        from ..generation import generate_answers

        # chunks so verdicts reach the cache as they are made, not only after the whole set
        chunk = max(1, self.batch_size * 4)
        for start in range(0, len(rows), chunk):
            prompts = [self._prompt(r) for r in rows[start : start + chunk]]
            outs = generate_answers(
                self.lm,
                prompts,
                self.batch_size,
                self.max_new_tokens,
                stop_at_newline=False,
                chat=self.chat,
                desc=f"judge {self.model_id}",
            )
            for offset, out in enumerate(outs):
                yield start + offset, read_verdict(out["answer"])


# ---------------------------------------------------------------- cache and driver


def judge_method(cfg: Mapping) -> dict:
    """Everything besides the row that can change a verdict; part of every cache key."""
    settings = judge_settings(cfg)
    backend = settings["backend"]
    method: dict = {"backend": backend, "judge_model": judge_model_name(settings)}
    if backend == "reference":
        # free to recompute, so any edit of the scorer's code makes new keys
        source = "".join(inspect.getsource(f) for f in (normalize_text, token_f1, f1_to_score))
        method["scorer"] = hashlib.sha256(source.encode()).hexdigest()[:16]
        return method
    method.update(
        system=SYSTEM_PROMPT,
        template=PROMPT_TEMPLATE,
        rubric=RUBRIC,
        parser=PARSER_VERSION,
        max_new_tokens=int(settings["max_new_tokens"]),  # a longer verdict may end on another [RESULT]
    )
    if backend == "hf":
        method["dtype"] = str(settings["dtype"])
        # absent when unset: verdicts cached before the key existed keep their keys
        if settings["chat_template_kwargs"]:
            method["chat_template_kwargs"] = dict(settings["chat_template_kwargs"])
    return method


def cache_key(method: Mapping, question: str, answer: str, reference: str) -> str:
    # a JSON list keeps field boundaries unambiguous ("a" + "bc" ≠ "ab" + "c")
    blob = json.dumps([method, question, answer, reference], ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def read_cache(cache_path: str | Path) -> dict[str, dict]:
    """Verdicts by key; later lines win. A torn last line (a crash mid-write) and an entry without a score
    are skipped."""
    cache: dict[str, dict] = {}
    path = Path(cache_path)
    if not path.exists():
        return cache
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            try:
                entry = json.loads(line)
                if entry["score"] in (1, 2, 3, 4, 5):
                    cache[entry["key"]] = entry
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
    return cache


def judge_all(
    rows: Iterable[dict], backend_cfg: Mapping, cache_path: str | Path, progress: bool = True
) -> pl.DataFrame:
    """Score every row {qid, question, answer, reference}; returns qid, score, reason, backend, cached.
    Each new verdict is appended to cache_path and flushed before the next, so a rerun or a crash never pays
    for a verdict twice; an unparseable verdict is never cached (the next run asks again)."""
    rows = list(rows)
    settings = judge_settings(backend_cfg)
    backend = settings["backend"]
    method = judge_method(settings)
    keys = [cache_key(method, r["question"], r["answer"], r["reference"]) for r in rows]
    cache = read_cache(cache_path)
    cached_before = set(cache)
    todo: dict[str, dict] = {}
    for key, row in zip(keys, rows, strict=True):
        if key not in cache:
            todo.setdefault(key, row)
    verdicts = dict(cache)
    if todo:
        judge = {"reference": ReferenceJudge, "openai": OpenAIJudge, "hf": HFJudge}[backend](settings)
        Path(cache_path).parent.mkdir(parents=True, exist_ok=True)
        pending = list(todo.items())
        with (
            Path(cache_path).open("a", encoding="utf-8") as handle,
            tqdm(total=len(pending), desc=f"judge ({backend})", unit="answer", disable=not progress) as bar,
        ):
            for i, verdict in judge.verdicts([row for _, row in pending]):
                key, row = pending[i]
                entry = {
                    "key": key,
                    "backend": backend,
                    "judge_model": method["judge_model"],
                    "qid": row["qid"],
                    "score": verdict.score,
                    "reason": verdict.reason,
                    "raw": verdict.raw,
                }
                verdicts[key] = entry
                if verdict.score is not None:
                    handle.write(json.dumps(entry, ensure_ascii=False) + "\n")
                    handle.flush()
                    os.fsync(handle.fileno())
                bar.update(1)
    schema = {"qid": pl.Utf8, "score": pl.Int64, "reason": pl.Utf8, "backend": pl.Utf8, "cached": pl.Boolean}
    table = [
        (row["qid"], verdicts[key]["score"], verdicts[key]["reason"], backend, key in cached_before)
        for row, key in zip(rows, keys, strict=True)
    ]
    return pl.DataFrame(table, schema=schema, orient="row")
