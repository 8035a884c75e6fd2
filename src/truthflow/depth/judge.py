"""Judges that score an answer 1–5 against a reference answer (METHOD B3), with an append-only verdict cache.
Backends: `reference` (token-F1, offline), `openai` (an OpenAI-compatible endpoint), `hf` (a local model);
the LLM ones send the rubric prompt of `depth.judge.prompt`. Greedy or sampled, `depth.judge.judgments`
verdicts per answer; a sampled one is seeded by the seed, its key and index alone, never by its batch."""

import hashlib
import inspect
import json
import logging
import math
import os
import random
import re
import statistics
import sys
from collections import Counter, namedtuple
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import polars as pl
from tqdm.auto import tqdm

from ..errors import TruthflowError
from ..redact import add_secret, redact
from ..text import normalize_text
from .authors import pending
from .prompts import JudgePrompt, load_judge_prompt

REFERENCE_MODEL = "token-f1"
OPENAI_WORKERS = 4  # requests in flight
JUDGED_TEXTS = ("question", "answer", "reference")  # a row's texts, in the order cache_key takes them
# bump when parse_verdict reads a text differently: cached verdicts of the old parser are then asked again
PARSER_VERSION = 1
PARSERS = ("strict", "authors")  # depth.judge.parser
# The DepthQA authors' cues (their evaluation/output_parser.py), in their order; case is ignored, so some
# repeat. Their parser takes the leftmost cue followed by an optional ( or [ and an integer, any integer.
AUTHORS_CUES = (
    r"\[RESULT\]",
    "Score",
    r"\[SCORE\]",
    r"\[RESULT\]:",
    "Score:",
    "score:",
    "Result:",
    r"\[Result\]",
    r"score\s+of",
    "Feedback:",
    "feedback:",
)
_AUTHORS = re.compile(rf"(?:{'|'.join(AUTHORS_CUES)})\s*(?:\(\s*|\[\s*|)\s*(\d+)", re.IGNORECASE)

_RESULT = re.compile(
    r"\[RESULT\]\s*:?\s*(?:score\s*(?:of)?\s*:?\s*|result\s*:?\s*)?[(\[]?\s*([1-5])(?![0-9.])", re.IGNORECASE
)
_INTEGER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])")
# score: strict 1-5, authors any integer; None when unparseable
Verdict = namedtuple("Verdict", "score reason raw", defaults=[None])
# score: the mean of the parsed verdicts (null: none), score_sd their sample SD (null below 2); judgments: all
# verdicts in index order (null: unparseable); reason: the first verdict's; cached: all came from the cache
SCORES_SCHEMA = {"qid": pl.Utf8, "score": pl.Float64, "score_sd": pl.Float64, "n_judgments": pl.Int64}
SCORES_SCHEMA |= {"n_unparseable": pl.Int64, "judgments": pl.List(pl.Int64), "reason": pl.Utf8}
SCORES_SCHEMA |= {"backend": pl.Utf8, "cached": pl.Boolean}


# The reference scorer's source is part of its cache keys (judge_method): an edit here makes new keys.
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


def sampled_f1_score(f1: float, temperature: float, draw: float) -> int:
    """The sampled reference verdict: 1 + floor(4·F1 + 1/2 + T·(u − 1/2)), u = `draw` in [0, 1), clipped to
    1–5. At T = 1 it rounds 4·F1 up with probability its fractional part (its mean is 1 + 4·F1); as T → 0
    it becomes f1_to_score."""
    return min(5, max(1, 1 + math.floor(4 * f1 + 0.5 + temperature * (draw - 0.5))))


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


def parse_verdict_authors(text: str | None) -> int | None:
    """The DepthQA authors' reading: the integer after the leftmost cue of AUTHORS_CUES, where the text has
    one ("...a score of 5 requires... [RESULT] 3" is 5, "Score: 4" is 4, "[RESULT] 4.5" is 4, "Score 7" 7)."""
    found = _AUTHORS.search(text or "")
    return int(found.group(1)) if found else None


def read_verdict(text: str | None, parser: str = "strict") -> Verdict:
    """The score (depth.judge.parser) and the feedback before `[RESULT]`; an unparseable text is a verdict
    without a score."""
    score = parse_verdict_authors(text) if parser == "authors" else parse_verdict(text)
    if score is None:
        return Verdict(None, f"unparseable verdict: {(text or '').strip()[:80]}", text)
    head = re.split(r"\[RESULT\]", text, flags=re.IGNORECASE)[0]
    return Verdict(score, re.sub(r"^\s*feedback\s*:\s*", "", head, flags=re.IGNORECASE).strip(), text)


# `settings`, here and below: the config's depth.judge section, its defaults filled (config.schema_defaults)
def sampled(settings: Mapping) -> bool:
    return settings["decoding"]["mode"] == "sampled"


def judge_prompt(settings: Mapping) -> JudgePrompt:
    return load_judge_prompt(settings["prompt"])


def draw_seed(seed: int, key: str, index: int) -> int:
    """The seed of one sampled verdict, from the configured seed, the answer's key and the verdict's index."""
    blob = hashlib.sha256(f"{seed}:{key}:{index}".encode()).digest()
    return int.from_bytes(blob[:4], "big") & 0x7FFFFFFF  # the OpenAI API takes a 32-bit seed


def judge_model_name(settings: Mapping) -> str:
    if (backend := settings["backend"]) == "reference":
        return REFERENCE_MODEL
    if not settings["model"]:
        raise TruthflowError(
            f"depth.judge.backend '{backend}' needs depth.judge.model (the judge model's name, dir or id)"
        )
    return str(settings["model"])


def check_judge_config(settings: Mapping, environ: Mapping[str, str]) -> None:
    """Raise TruthflowError, naming the config key or variable, when the judge cannot run as configured."""
    judge_model_name(settings)
    if not pending(settings["prompt"]):  # an authors' file: rule authors_prompts makes and checks it
        judge_prompt(settings)
    mode, n = settings["decoding"]["mode"], int(settings["judgments"])
    if n > 1 and mode == "greedy":
        raise TruthflowError(
            f"config key 'depth.judge.judgments' is {n}, but depth.judge.decoding.mode is greedy, whose "
            "verdicts repeat each other: set depth.judge.decoding.mode: sampled, or judgments: 1"
        )
    if mode == "sampled" and settings["backend"] == "hf":
        raise TruthflowError(
            "config key 'depth.judge.decoding.mode': the hf judge decodes greedily only; set mode: greedy, "
            "or serve the model at an OpenAI-compatible endpoint (vLLM, llama.cpp) and use backend: openai"
        )
    key_env = settings["api_key_env"]
    if settings["backend"] == "openai" and key_env and not environ.get(key_env):
        raise TruthflowError(
            f"depth.judge.backend 'openai' needs an API key, but ${key_env} is not set "
            f"(depth.judge.api_key_env: {key_env}): export {key_env}=<key>, or set depth.judge.api_key_env "
            f"to the variable that holds it (null for an endpoint that takes no key)"
        )


class ReferenceJudge:
    """Token-F1 against the reference; sampled, its verdict is drawn from the verdict's own seed."""

    def __init__(self, settings: Mapping) -> None:
        self.decoding = settings["decoding"]

    def verdicts(self, rows: list[dict]) -> Iterator[tuple[int, Verdict]]:
        for i, row in enumerate(rows):
            f1 = token_f1(row["answer"], row["reference"])
            if row.get("seed") is None:
                yield i, Verdict(f1_to_score(f1), f"token-F1 {f1:.3f}")
            else:
                draw = random.Random(row["seed"]).random()
                score = sampled_f1_score(f1, float(self.decoding["temperature"]), draw)
                yield i, Verdict(score, f"token-F1 {f1:.3f}, draw {draw:.3f}")


def _one_line(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return redact(" ".join(str(text).split()))[:200]


class OpenAIJudge:
    """Chat completions (`openai` SDK), temperature 0 or sampled (temperature, top_p, each verdict's seed).
    The SDK retries a network error, a timeout, HTTP 408/409/429 and 5xx `retries` times; any other error
    (401, 400, an unknown model) stops the job with one line naming the endpoint and the status."""

    def __init__(self, settings: Mapping) -> None:
        import openai

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
        decoding = settings["decoding"]
        sampling = {"temperature": float(decoding["temperature"]), "top_p": float(decoding["top_p"])}
        sampling = sampling if sampled(settings) else {"temperature": 0}
        self.request = dict(model=self.model, max_tokens=int(settings["max_new_tokens"]), **sampling)
        self.openai, self.failed, self.prompt = openai, None, judge_prompt(settings)
        self.parser = settings["parser"]
        for name in ("httpx", "httpx2", "httpcore"):  # no line per request in the rule log
            logging.getLogger(name).setLevel(logging.WARNING)

    def _error(self, exc: Exception) -> TruthflowError:
        if isinstance(exc, self.openai.APIStatusError):
            status = exc.status_code
            if status in (408, 409, 429) or status >= 500:  # the statuses the SDK retries
                head = f"still answers HTTP {status} after {self.client.max_retries + 1} tries"
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
                f"judge endpoint {self.url} is unreachable after {self.client.max_retries + 1} tries "
                f"({_one_line(exc.__cause__ or exc)}); check depth.judge.base_url"
            )
        return TruthflowError(f"judge endpoint {self.url} gave an unusable answer: {_one_line(str(exc))}")

    def one(self, row: dict) -> Verdict:
        if self.failed:  # another request hit an error no retry cures: a worker free now asks nothing more
            raise self.failed
        prompt = self.prompt.user(row["question"], row["answer"], row["reference"])
        messages = [{"role": "system", "content": self.prompt.system}, {"role": "user", "content": prompt}]
        seed = {} if row.get("seed") is None else {"seed": row["seed"]}
        reply = None
        try:
            reply = self.client.chat.completions.create(messages=messages, **self.request, **seed)
            return read_verdict(reply.choices[0].message.content, self.parser)
        except self.openai.OpenAIError as exc:
            self.failed = self._error(exc)
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

    def __init__(self, settings: Mapping, generation_backend: str = "engine") -> None:
        self.settings, self.prompt = settings, judge_prompt(settings)
        self.model_id = judge_model_name(settings)
        self.generation_backend = generation_backend  # generation.backend: vLLM or the engine decodes
        self.lm = self._load()
        self.chat = bool(getattr(self.lm.tokenizer, "chat_template", None))

    def _load(self):
        from ..models import INFO_FILE, LoadedModel, load_model, load_pretrained

        dtype = str(self.settings["dtype"])
        prepared = (Path(self.model_id) / INFO_FILE).exists()
        if self.generation_backend == "vllm":
            from ..vllm_answers import VllmUnavailable, prepare_vllm

            try:
                if not prepared:
                    raise VllmUnavailable(
                        "vLLM judges with a prepared model directory (resources/models/<name>)"
                    )
                # a verdict's prompt holds a whole answer: the judge model's context is the limit
                return prepare_vllm(
                    Path(self.model_id), dtype, 1, None, int(self.settings["batch_size"]), None
                )
            except VllmUnavailable as e:
                print(f"judge {self.model_id}: the engine judges: {e}", file=sys.stderr, flush=True)
        if prepared:
            return load_model(Path(self.model_id), dtype)
        try:  # a hub id or a plain directory: the same device assignment as the model jobs
            model, tokenizer, device = load_pretrained(self.model_id, dtype)
        except OSError as e:
            raise TruthflowError(
                f"depth.judge.model '{self.model_id}' cannot be loaded (dir or hub id?): {_one_line(str(e))}"
            ) from None
        return LoadedModel(model=model, tokenizer=tokenizer, info={"name": self.model_id}, device=device)

    def _prompt(self, row: dict) -> str:
        from ..generation import build_prompt

        # some chat templates (Gemma) reject a system turn, so the system text leads the user turn
        user = self.prompt.user(row["question"], row["answer"], row["reference"])
        content = self.prompt.system + "\n\n" + user
        if not self.chat:
            return content
        kwargs = dict(self.settings["chat_template_kwargs"] or {})
        # a thinking template (Qwen3) would think past max_new_tokens before a verdict: off unless configured
        if "enable_thinking" in str(self.lm.tokenizer.chat_template):
            kwargs.setdefault("enable_thinking", False)
        return build_prompt(self.lm.tokenizer, content, True, "", chat_template_kwargs=kwargs)

    def verdicts(self, rows: list[dict]) -> Iterator[tuple[int, Verdict]]:
        from ..generation import generate_answers

        size, limit = int(self.settings["batch_size"]), int(self.settings["max_new_tokens"])
        chunk = max(1, size * 4)  # chunks: verdicts reach the cache as made
        if getattr(self.lm, "backend", "engine") == "vllm" and self.lm.llm is None:
            from ..generation import encode_prompt

            # vLLM's engine holds the longest prompt of every chunk, not only the first's
            longest = max(len(encode_prompt(self.lm.tokenizer, self._prompt(r), self.chat)) for r in rows)
            self.lm.max_model_len = longest + limit
        options = dict(stop_at_newline=False, chat=self.chat, desc=f"judge {self.model_id}")
        for start in range(0, len(rows), chunk):
            prompts = [self._prompt(r) for r in rows[start : start + chunk]]
            for offset, out in enumerate(generate_answers(self.lm, prompts, size, limit, **options)):
                yield start + offset, read_verdict(out["answer"], self.settings["parser"])


def judge_method(settings: Mapping, generation_backend: str = "engine") -> dict:
    """Everything besides the row (and a sampled verdict's index) that can change a verdict; part of every
    cache key. Greedy verdicts keep the keys they had before decoding was a setting, an hf judge's on the
    engine the keys they had before vLLM was a backend."""
    backend = settings["backend"]
    method: dict = {"backend": backend, "judge_model": judge_model_name(settings)}
    if sampled(settings):
        method["decoding"] = dict(settings["decoding"])
    if backend == "reference":
        # free to recompute, so any edit of the scorer's code makes new keys
        scorer = (normalize_text, token_f1, f1_to_score) + ((sampled_f1_score,) if sampled(settings) else ())
        source = "".join(inspect.getsource(f) for f in scorer)
        return method | {"scorer": hashlib.sha256(source.encode()).hexdigest()[:16]}
    prompt = judge_prompt(settings)
    # the strict parser keeps the keys it had before parsers were a setting
    parser = PARSER_VERSION if settings["parser"] == "strict" else settings["parser"]
    method.update(system=prompt.system, template=prompt.task, rubric=prompt.rubric, parser=parser)
    method["max_new_tokens"] = int(settings["max_new_tokens"])  # a longer verdict may end on another [RESULT]
    if backend == "hf":
        method["dtype"] = str(settings["dtype"])
        if generation_backend == "vllm":
            method["generation_backend"] = "vllm"
        # absent when unset: verdicts cached before the key existed keep their keys
        if settings["chat_template_kwargs"]:
            method["chat_template_kwargs"] = dict(settings["chat_template_kwargs"])
    return method


def cache_key(method: Mapping, question: str, answer: str, reference: str, index: int | None = None) -> str:
    """The key of a verdict; `index`: a sampled verdict's index among the answer's verdicts (None: greedy)."""
    # a JSON list keeps field boundaries unambiguous ("a" + "bc" ≠ "ab" + "c")
    fields = [method, question, answer, reference] + ([] if index is None else [index])
    return hashlib.sha256(json.dumps(fields, ensure_ascii=False, sort_keys=True).encode()).hexdigest()


def read_cache(cache_path: str | Path) -> dict[str, dict]:
    """Verdicts by key; later lines win. A torn last line (a crash mid-write) is skipped, and so is a greedy
    entry without a score; a sampled one (it has an index) is a draw like any other and is kept."""
    cache, path = {}, Path(cache_path)
    for line in path.read_text(encoding="utf-8").split("\n") if path.exists() else ():
        try:
            entry = json.loads(line)
            draw = entry["score"] is None and entry.get("index") is not None  # a sampled draw
            # the authors' parser keeps any integer (bool is an int to Python, never a score)
            if (isinstance(entry["score"], int) and not isinstance(entry["score"], bool)) or draw:
                cache[entry["key"]] = entry
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return cache


def judge_all(
    rows: Iterable[dict],
    settings: Mapping,
    cache_path: str | Path,
    progress: bool = True,
    generation_backend: str = "engine",
) -> pl.DataFrame:
    """Score every row {qid, question, answer, reference} `depth.judge.judgments` times; one row per answer
    (SCORES_SCHEMA). Each new verdict is appended to cache_path and flushed at once, so none is paid twice; a
    greedy unparseable verdict is not cached, a sampled one is (asking again until one parses would bias)."""
    # the authors strip question, reference and answer before they fill their judge prompt (their
    # batch_eval_openai.py); here, so every path (generated or released answers, every backend) and the cache
    # key see the texts the prompt holds
    rows = [{**row, **{k: str(row[k]).strip() for k in JUDGED_TEXTS}} for row in rows]
    backend, method = settings["backend"], judge_method(settings, generation_backend)
    draws = range(int(settings["judgments"])) if sampled(settings) else [None]
    seed, verdicts = int(settings["decoding"]["seed"]), read_cache(cache_path)
    keys, todo = [], {}  # keys: per row, the key of each of its verdicts
    for row in rows:
        texts = tuple(row[k] for k in JUDGED_TEXTS)
        base = cache_key(method, *texts)
        keys.append([base if j is None else cache_key(method, *texts, j) for j in draws])
        for j, key in zip(draws, keys[-1], strict=True):
            if key not in verdicts and key not in todo:
                todo[key] = {**row, "index": j, "seed": None if j is None else draw_seed(seed, base, j)}
    if todo:
        kinds = {"reference": ReferenceJudge, "openai": OpenAIJudge, "hf": HFJudge}
        judge = HFJudge(settings, generation_backend) if backend == "hf" else kinds[backend](settings)
        Path(cache_path).parent.mkdir(parents=True, exist_ok=True)
        pending = list(todo.items())
        with (
            Path(cache_path).open("a", encoding="utf-8") as handle,
            tqdm(total=len(pending), desc=f"judge ({backend})", unit="verdict", disable=not progress) as bar,
        ):
            for i, verdict in judge.verdicts([row for _, row in pending]):
                key, row = pending[i]
                entry = dict(key=key, backend=backend, judge_model=method["judge_model"], qid=row["qid"])
                entry.update(score=verdict.score, reason=verdict.reason, raw=verdict.raw)
                if row["index"] is not None:
                    entry.update(index=row["index"], seed=row["seed"])
                verdicts[key] = entry
                if verdict.score is not None or row["index"] is not None:
                    handle.write(json.dumps(entry, ensure_ascii=False) + "\n")
                    handle.flush()
                    os.fsync(handle.fileno())
                bar.update(1)
    table = []
    for row, ks in zip(rows, keys, strict=True):
        scores = [verdicts[k]["score"] for k in ks]
        parsed = [x for x in scores if x is not None]
        mean = statistics.fmean(parsed) if parsed else None
        sd = statistics.stdev(parsed) if len(parsed) > 1 else None  # the sample SD (n - 1)
        reason, cached = verdicts[ks[0]]["reason"], all(k not in todo for k in ks)
        table.append((row["qid"], mean, sd, len(scores), scores.count(None), scores, reason, backend, cached))
    return pl.DataFrame(table, schema=SCORES_SCHEMA, orient="row")
