"""Judges that score an answer 1–5 against a reference answer (METHOD B3), with an append-only verdict cache.

Backends: `reference` (token-F1, offline, deterministic), `openai` (any OpenAI-compatible chat endpoint) and
`hf` (a local transformers model). The LLM backends share one absolute-grading rubric prompt in the style of
DepthQA / Prometheus: feedback, then `[RESULT] <1-5>`.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import math
import os
import re
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import polars as pl
from tqdm.auto import tqdm

from .errors import TruthflowError
from .labels import normalize_text

BACKENDS = ("reference", "openai", "hf")
REFERENCE_MODEL = "token-f1"

SYSTEM_PROMPT = (
    "You are a fair judge. You give clear, objective feedback on a response and grade it strictly by the "
    "score rubric you are given."
)

RUBRIC_TEMPLATE = """###Task Description:
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
[Is the response correct, accurate and factual?]
Score 1: Mostly wrong or not factual; it misunderstands the question or topic.
Score 2: Partly right, with serious factual errors or inaccuracies.
Score 3: Broadly right and factual, with minor errors or missing detail.
Score 4: Right, accurate and factual, with only small omissions or slips that do not matter much.
Score 5: Entirely right, accurate and factual, as complete and precise as the reference answer.

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
    return RUBRIC_TEMPLATE.format(instruction=question, response=answer, reference=reference)


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


def _feedback(text: str) -> str:
    head = re.split(r"\[RESULT\]", text, flags=re.IGNORECASE)[0]
    return re.sub(r"^\s*feedback\s*:\s*", "", head, flags=re.IGNORECASE).strip()


def _unparseable(text: str | None) -> Verdict:
    return Verdict(None, f"unparseable verdict: {(text or '').strip()[:80]}", text)


# ---------------------------------------------------------------- backends


def judge_model_name(cfg: dict) -> str:
    backend = cfg.get("backend", "reference")
    if backend not in BACKENDS:
        raise TruthflowError(f"judge backend '{backend}' is not one of {list(BACKENDS)}")
    if backend == "reference":
        return REFERENCE_MODEL
    if not cfg.get("model"):
        raise TruthflowError(
            f"judge backend '{backend}' needs judge.model (the judge model's name, dir or id)"
        )
    return str(cfg["model"])


class ReferenceJudge:
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg

    def verdicts(self, rows: list[dict]) -> Iterator[tuple[int, Verdict]]:
        for i, row in enumerate(rows):
            f1 = token_f1(row["answer"], row["reference"])
            yield i, Verdict(f1_to_score(f1), f"token-F1 {f1:.3f}")


class OpenAIJudge:
    """POST {base_url}/chat/completions with the rubric prompt; temperature 0."""

    def __init__(self, cfg: dict) -> None:
        if not cfg.get("base_url"):
            raise TruthflowError(
                "judge backend 'openai' needs judge.base_url (e.g. https://api.openai.com/v1)"
            )
        self.model = judge_model_name(cfg)
        self.url = str(cfg["base_url"]).rstrip("/") + "/chat/completions"
        key_env = cfg.get("api_key_env", "OPENAI_API_KEY")
        self.key = None
        if key_env:  # api_key_env: null for local servers that take no key
            self.key = os.environ.get(key_env)
            if not self.key:
                raise TruthflowError(
                    f"judge backend 'openai' ({self.url}) needs an API key: export {key_env}=<key> "
                    f"(or set judge.api_key_env to the variable that holds it)"
                )
        self.key_env = key_env
        self.max_tokens = int(cfg.get("max_tokens", 512))
        self.max_retries = int(cfg.get("max_retries", 2))
        self.http_retries = int(cfg.get("http_retries", 5))
        self.backoff_s = float(cfg.get("backoff_s", 2.0))
        self.timeout_s = float(cfg.get("timeout_s", 120.0))
        self.workers = max(1, int(cfg.get("workers", 4)))

    def _post(self, body: dict) -> dict:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        for attempt in range(self.http_retries + 1):
            request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    payload = response.read()
            except urllib.error.HTTPError as exc:
                detail = exc.read()[:300].decode(errors="replace")
                if exc.code == 429 or exc.code >= 500:
                    if attempt < self.http_retries:
                        time.sleep(self.backoff_s * 2**attempt)
                        continue
                    raise TruthflowError(
                        f"judge endpoint {self.url} still answers HTTP {exc.code} after "
                        f"{self.http_retries + 1} tries: {detail}"
                    ) from None
                hint = f"; check the key in ${self.key_env}" if exc.code in (401, 403) else ""
                raise TruthflowError(
                    f"judge endpoint {self.url} answered HTTP {exc.code}{hint}: {detail}"
                ) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as exc:
                reason = getattr(exc, "reason", exc)
                raise TruthflowError(
                    f"judge endpoint {self.url} is unreachable ({reason}); check judge.base_url"
                ) from None
            try:
                return json.loads(payload)
            except json.JSONDecodeError:
                raise TruthflowError(
                    f"judge endpoint {self.url} did not answer JSON: {payload[:200].decode(errors='replace')}"
                ) from None
        raise AssertionError("unreachable")

    def _content(self, answer: dict) -> str | None:
        try:
            return answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise TruthflowError(
                f"judge endpoint {self.url} answered without choices[0].message.content: {str(answer)[:200]}"
            ) from None

    def one(self, row: dict) -> Verdict:
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {
                "role": "user",
                "content": build_rubric_prompt(row["question"], row["answer"], row["reference"]),
            },
        ]
        body = {"model": self.model, "messages": messages, "temperature": 0, "max_tokens": self.max_tokens}
        text = None
        for _ in range(self.max_retries + 1):
            text = self._content(self._post(body))
            score = parse_verdict(text)
            if score is not None:
                return Verdict(score, _feedback(text), text)
        return _unparseable(text)

    def verdicts(self, rows: list[dict]) -> Iterator[tuple[int, Verdict]]:
        if self.workers == 1 or len(rows) < 2:
            for i, row in enumerate(rows):
                yield i, self.one(row)
            return
        pool = ThreadPoolExecutor(max_workers=self.workers)
        try:
            futures = {pool.submit(self.one, row): i for i, row in enumerate(rows)}
            # as they finish, so a slow request never holds finished verdicts out of the cache
            for future in as_completed(futures):
                yield futures[future], future.result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


class HFJudge:
    """A local transformers model with the rubric prompt, greedy. Greedy repeats itself, so no retries."""

    def __init__(self, cfg: dict) -> None:
        self.model_id = judge_model_name(cfg)
        self.cfg = cfg
        self.batch_size = int(cfg.get("batch_size", 8))
        self.max_new_tokens = int(cfg.get("max_new_tokens", 512))
        self.lm = self._load()
        self.chat = bool(getattr(self.lm.tokenizer, "chat_template", None))

    def _load(self):
        from .models import INFO_FILE, LoadedModel, load_model, pick_device, torch_dtype

        dtype = str(self.cfg.get("dtype", "auto"))
        path = Path(self.model_id)
        if (path / INFO_FILE).exists():
            return load_model(path, dtype, int(self.cfg.get("gpus", 1)), self.cfg.get("threads"))
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = pick_device()
        try:
            tokenizer = AutoTokenizer.from_pretrained(self.model_id)
            model = AutoModelForCausalLM.from_pretrained(self.model_id, dtype=torch_dtype(dtype))
        except OSError as exc:
            raise TruthflowError(
                f"judge model '{self.model_id}' cannot be loaded (dir or hub id?): {exc}"
            ) from None
        model.to(device).eval()
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        return LoadedModel(model=model, tokenizer=tokenizer, info={"name": self.model_id}, device=device)

    def _prompt(self, row: dict) -> str:
        from .generation import build_prompt

        # some chat templates (Gemma) reject a system turn, so the system text leads the user turn
        content = (
            SYSTEM_PROMPT + "\n\n" + build_rubric_prompt(row["question"], row["answer"], row["reference"])
        )
        return build_prompt(self.lm.tokenizer, content, chat=True, instruction="") if self.chat else content

    def verdicts(self, rows: list[dict]) -> Iterator[tuple[int, Verdict]]:
        from .generation import generate_answers

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
                text = out["answer"]
                score = parse_verdict(text)
                yield start + offset, Verdict(score, _feedback(text), text) if score else _unparseable(text)


def make_judge(cfg: dict):
    backend = cfg.get("backend", "reference")
    judge_model_name(cfg)
    return {"reference": ReferenceJudge, "openai": OpenAIJudge, "hf": HFJudge}[backend](cfg)


# ---------------------------------------------------------------- cache and driver


def cache_key(backend: str, judge_model: str, question: str, answer: str, reference: str) -> str:
    # a JSON list keeps field boundaries unambiguous ("a" + "bc" ≠ "ab" + "c")
    blob = json.dumps([backend, judge_model, question, answer, reference], ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def read_cache(cache_path: str | Path) -> dict[str, dict]:
    """Verdicts by key; a torn last line (a crash mid-write) is skipped, and later lines win."""
    cache: dict[str, dict] = {}
    path = Path(cache_path)
    if not path.exists():
        return cache
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            try:
                entry = json.loads(line)
                cache[entry["key"]] = entry
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
    return cache


def _check_rows(rows: list[dict]) -> None:
    for i, row in enumerate(rows):
        missing = [f for f in ("qid", "question", "answer", "reference") if f not in row]
        if missing:
            raise TruthflowError(f"judge row #{i} (qid {row.get('qid')!r}) lacks field(s) {missing}")


def judge_all(
    rows: Iterable[dict], backend_cfg: dict, cache_path: str | Path, progress: bool = True
) -> pl.DataFrame:
    """Score every row {qid, question, answer, reference}; returns qid, score, reason, backend, cached.

    Every new verdict, a missing one included, is appended to cache_path and flushed before the next, so a
    rerun or a crash never pays for a verdict twice. The backend is only built when something is uncached.
    """
    rows = list(rows)
    _check_rows(rows)
    backend = backend_cfg.get("backend", "reference")
    judge_model = judge_model_name(backend_cfg)
    keys = [cache_key(backend, judge_model, r["question"], r["answer"], r["reference"]) for r in rows]
    cache = read_cache(cache_path)
    cached_before = set(cache)
    todo: dict[str, dict] = {}
    for key, row in zip(keys, rows, strict=True):
        if key not in cache and key not in todo:
            todo[key] = row
    if todo:
        judge = make_judge(backend_cfg)
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
                    "judge_model": judge_model,
                    "qid": row["qid"],
                    "score": verdict.score,
                    "reason": verdict.reason,
                    "raw": verdict.raw,
                }
                handle.write(json.dumps(entry, ensure_ascii=False) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
                cache[key] = entry
                bar.update(1)
    return pl.DataFrame(
        {
            "qid": [r["qid"] for r in rows],
            "score": [cache[k]["score"] for k in keys],
            "reason": [cache[k]["reason"] for k in keys],
            "backend": [backend] * len(rows),
            "cached": [k in cached_before for k in keys],
        },
        schema={
            "qid": pl.Utf8,
            "score": pl.Int64,
            "reason": pl.Utf8,
            "backend": pl.Utf8,
            "cached": pl.Boolean,
        },
    )
