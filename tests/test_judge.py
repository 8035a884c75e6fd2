"""Judges (METHOD B3): token-F1 reference backend by hand, OpenAI backend against a real local server, cache
keys, the config schema and the parse-time key check."""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import polars as pl
import pytest
import yaml
from conftest import REPO, small_config

from truthflow.config import check_schema, schema_defaults
from truthflow.depth import judge
from truthflow.depth.judge import f1_to_score, judge_all, normalize_text, parse_verdict, read_cache, token_f1
from truthflow.errors import TruthflowError

KEY_ENV = "TRUTHFLOW_TEST_JUDGE_KEY"
PARSER_DIGEST = "7562f7a0f139"
ROW = {"qid": "d1_q1", "question": "What is a thylakoid?", "answer": "A membrane sac.", "reference": "A sac."}


def judge_cfg(cfg: dict) -> dict:
    """depth.judge as the workflow fills it."""
    return schema_defaults("depth", "judge", given=cfg)


# ---------------------------------------------------------------- reference backend


def test_normalize_text() -> None:
    assert normalize_text("The  Cat's, an APPLE!\n") == "cats apple"


def test_token_f1_hand_case() -> None:
    # "cat dog" vs "cat bird fish": 1 shared token, P = 1/2, R = 1/3, F1 = 0.4 → 1 + round(1.6) = 3
    assert token_f1("Cat, dog.", "A cat bird fish") == pytest.approx(0.4)
    assert f1_to_score(0.4) == 3


def test_f1_score_mapping_rounds_halves_up() -> None:
    # 8 tokens each, 5 shared: F1 = 5/8, 4·F1 = 2.5 → 3 (Python's round would give 2) → score 4
    answer, reference = "w1 w2 w3 w4 w5 x1 x2 x3", "w1 w2 w3 w4 w5 y1 y2 y3"
    assert token_f1(answer, reference) == pytest.approx(0.625)
    assert f1_to_score(0.625) == 4
    assert f1_to_score(0.0) == 1 and f1_to_score(1.0) == 5


def test_token_f1_edges() -> None:
    assert token_f1("", "a reference") == 0.0
    assert token_f1("The answer.", "answer") == 1.0


def test_reference_backend_table_and_cache(tmp_path) -> None:
    rows = [ROW, {**ROW, "qid": "d1_q2", "answer": "Unrelated words only."}]
    cache = tmp_path / "judge.jsonl"
    first = judge_all(rows, judge_cfg({"backend": "reference"}), cache, progress=False)
    assert first.schema == pl.Schema(judge.SCORES_SCHEMA)
    # "membrane sac" vs "sac": P = 1/2, R = 1, F1 = 2/3 → 1 + round(2.67) = 4
    assert first["score"].to_list() == [4, 1]
    assert first["judgments"].to_list() == [[4], [1]] and first["n_judgments"].to_list() == [1, 1]
    assert first["score_sd"].to_list() == [None, None] and first["n_unparseable"].to_list() == [0, 0]
    assert first["cached"].to_list() == [False, False]
    second = judge_all(rows, judge_cfg({"backend": "reference"}), cache, progress=False)
    assert second["cached"].to_list() == [True, True]
    assert second["score"].to_list() == [4, 1]
    assert len(cache.read_text().splitlines()) == 2


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("Feedback: good. [RESULT] 4", 4),
        ("Feedback: ok [RESULT] (5)", 5),
        ("[RESULT] Score: 2", 2),
        ("Clear answer. [RESULT] 4/5", 4),
        ("[RESULT] 1 ... later [RESULT] 3", 3),
        ("3", 3),
        ("  5 \n", 5),
        ("[RESULT] 6", None),
        ("between 2 and 3", None),
        ("no score here", None),
        ("4.5", None),
        ("", None),
    ],
)
def test_parse_verdict(text: str, score: int | None) -> None:
    assert parse_verdict(text) == score


# ---------------------------------------------------------------- openai backend on a real local HTTP server


class FakeEndpoint:
    """An OpenAI-compatible /v1/chat/completions on 127.0.0.1; answers the queued replies in turn."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.replies: list[
            tuple[int, str]
        ] = []  # status, content; "{headers}" in an error becomes the headers
        self.reply = None  # request body -> content of a 200, in place of the queue (replies by question)
        self.lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with endpoint.lock:
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    endpoint.requests.append({"path": self.path, "headers": headers, "body": body})
                    if endpoint.reply is not None:
                        status, content = 200, endpoint.reply(body)
                    else:
                        status, content = (
                            endpoint.replies.pop(0) if len(endpoint.replies) > 1 else endpoint.replies[0]
                        )
                if status == 200 and content == "{no choices}":  # a proxy's reply of another shape
                    payload = {"id": "chatcmpl-test", "object": "chat.completion", "choices": []}
                elif status == 200:
                    payload = {
                        "id": "chatcmpl-test",
                        "object": "chat.completion",
                        "model": body["model"],
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": content},
                            }
                        ],
                    }
                else:  # some proxies echo the request, Authorization header included
                    payload = {"error": {"message": content.replace("{headers}", str(dict(self.headers)))}}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("retry-after-ms", "10")  # the SDK's backoff honours it: fast tests
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint():
    server = FakeEndpoint()
    yield server
    server.close()


@pytest.fixture
def key(monkeypatch) -> str:
    monkeypatch.setenv(KEY_ENV, "sk-test-123")
    return "sk-test-123"


def openai_cfg(base_url: str, **extra) -> dict:
    return judge_cfg(
        {"backend": "openai", "base_url": base_url, "model": "judge-model", "api_key_env": KEY_ENV, **extra}
    )


def test_openai_good_verdict(endpoint, key, tmp_path) -> None:
    endpoint.replies = [(200, "Feedback: The response matches the reference. [RESULT] 4")]
    table = judge_all([ROW], openai_cfg(endpoint.base_url), tmp_path / "c.jsonl", progress=False)
    assert table.row(0, named=True) == {
        "qid": "d1_q1",
        "score": 4,
        "score_sd": None,
        "n_judgments": 1,
        "n_unparseable": 0,
        "judgments": [4],
        "reason": "The response matches the reference.",
        "backend": "openai",
        "cached": False,
    }
    [request] = endpoint.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["authorization"] == f"Bearer {key}"
    body = request["body"]
    assert body["model"] == "judge-model" and body["temperature"] == 0 and body["max_tokens"] > 0
    prompt = body["messages"][-1]["content"]
    for part in (ROW["question"], ROW["answer"], ROW["reference"], "[RESULT]"):
        assert part in prompt


def test_openai_authors_parser_scores_and_caches_any_integer(endpoint, key, tmp_path) -> None:
    """depth.judge.parser: authors reads "Score: 4" among other numbers, keeps 7 (out of 1-5, as the
    authors' code did), caches both, and keys its verdicts apart from the strict parser's."""
    cache, rows = tmp_path / "c.jsonl", [ROW, {**ROW, "qid": "d1_q2", "answer": "A disc."}]
    endpoint.replies = [(200, "It covers 2 of the 3 points. Score: 4"), (200, "Too short. [RESULT] 7")]
    cfg = openai_cfg(endpoint.base_url, parser="authors")
    table = judge_all(rows, cfg, cache, progress=False)
    assert sorted(table["judgments"].to_list()) == [[4], [7]] and table["n_unparseable"].sum() == 0
    again = judge_all(rows, cfg, cache, progress=False)
    assert len(endpoint.requests) == 2 and again["cached"].all()
    assert again["score"].to_list() == table["score"].to_list()
    strict, authors = (judge.judge_method(openai_cfg(endpoint.base_url, parser=p)) for p in judge.PARSERS)
    assert (strict["parser"], authors["parser"]) == (judge.PARSER_VERSION, "authors")


def test_openai_malformed_verdict_is_missing_and_never_cached(endpoint, key, tmp_path) -> None:
    endpoint.replies = [(200, "I would rather not grade this answer today.")]
    cache = tmp_path / "c.jsonl"
    table = judge_all([ROW], openai_cfg(endpoint.base_url), cache, progress=False)
    assert len(endpoint.requests) == 1
    assert table["score"].to_list() == [None]
    assert table["reason"][0] == "unparseable verdict: I would rather not grade this answer today."
    assert not cache.exists() or cache.read_text() == ""  # a missing verdict is not cached
    # so the rerun asks again, and keeps the verdict once there is one
    endpoint.replies = [(200, "Now fine. [RESULT] 4")]
    again = judge_all([ROW], openai_cfg(endpoint.base_url), cache, progress=False)
    assert len(endpoint.requests) == 2
    assert again["cached"].to_list() == [False] and again["score"].to_list() == [4]
    third = judge_all([ROW], openai_cfg(endpoint.base_url), cache, progress=False)
    assert len(endpoint.requests) == 2 and third["cached"].to_list() == [True]


def test_failed_verdicts_in_an_old_cache_are_asked_again(endpoint, key, tmp_path) -> None:
    cache = tmp_path / "c.jsonl"
    method = judge.judge_method(openai_cfg(endpoint.base_url))
    stale = judge.cache_key(method, ROW["question"], ROW["answer"], ROW["reference"])
    cache.write_text(
        json.dumps({"key": stale, "qid": "d1_q1", "score": None, "reason": "unparseable"}) + "\n"
    )
    endpoint.replies = [(200, "[RESULT] 2")]
    table = judge_all([ROW], openai_cfg(endpoint.base_url), cache, progress=False)
    assert len(endpoint.requests) == 1 and table["score"].to_list() == [2]


def test_openai_reply_without_content_is_one_line_naming_the_judge_model(endpoint, key, tmp_path) -> None:
    endpoint.replies = [(200, "{no choices}")]
    with pytest.raises(TruthflowError, match="judge model 'judge-model' .* without choices") as err:
        judge_all([ROW], openai_cfg(endpoint.base_url), tmp_path / "c.jsonl", progress=False)
    assert "\n" not in str(err.value) and err.value.__cause__ is None


def test_openai_rate_limit_is_retried(endpoint, key, tmp_path) -> None:
    # the SDK's own retries (max_retries = depth.judge.retries)
    endpoint.replies = [(429, "slow down"), (503, "busy"), (200, "[RESULT] 5")]
    table = judge_all([ROW], openai_cfg(endpoint.base_url), tmp_path / "c.jsonl", progress=False)
    assert table["score"].to_list() == [5]
    assert len(endpoint.requests) == 3


def test_openai_persistent_server_error_names_the_url(endpoint, key, tmp_path) -> None:
    endpoint.replies = [(500, "broken")]
    cache = tmp_path / "c.jsonl"
    with pytest.raises(TruthflowError, match=re.escape(endpoint.base_url + "/chat/completions")) as err:
        judge_all([ROW], openai_cfg(endpoint.base_url, retries=2), cache, progress=False)
    assert len(endpoint.requests) == 3
    assert "HTTP 500 after 3 tries" in str(err.value)
    assert read_cache(cache) == {}  # an outage is no verdict: nothing cached, the rerun asks again


def test_openai_refused_connection_names_the_url(key, tmp_path) -> None:
    with socket.socket() as sock:  # a port that was free a moment ago and now has no listener
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base_url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(TruthflowError, match=re.escape(base_url)):
        judge_all([ROW], openai_cfg(base_url, retries=1), tmp_path / "c.jsonl", progress=False)


def test_openai_missing_key_names_the_variable(endpoint, monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    endpoint.replies = [(200, "[RESULT] 5")]
    with pytest.raises(TruthflowError, match=KEY_ENV):
        judge_all([ROW], openai_cfg(endpoint.base_url), tmp_path / "c.jsonl", progress=False)
    assert endpoint.requests == []


def test_openai_cache_second_call_makes_no_request(endpoint, key, monkeypatch, tmp_path) -> None:
    endpoint.replies = [(200, "Fine. [RESULT] 3")]
    rows = [ROW, {**ROW, "qid": "d1_q2", "answer": "Another answer."}]
    cache = tmp_path / "sub" / "c.jsonl"
    first = judge_all(rows, openai_cfg(endpoint.base_url), cache, progress=False)
    assert len(endpoint.requests) == 2
    assert first["cached"].to_list() == [False, False]
    lines = [json.loads(line) for line in cache.read_text().splitlines()]
    assert sorted(e["qid"] for e in lines) == ["d1_q1", "d1_q2"]
    assert all(len(e["key"]) == 64 and e["judge_model"] == "judge-model" for e in lines)

    # fully cached: no request, and no key needed any more
    monkeypatch.delenv(KEY_ENV)
    second = judge_all(rows, openai_cfg(endpoint.base_url), cache, progress=False)
    assert len(endpoint.requests) == 2
    assert second["cached"].to_list() == [True, True]
    assert second["score"].to_list() == [3, 3]
    assert second["qid"].to_list() == ["d1_q1", "d1_q2"]

    # a changed answer is a new key; a torn last line (a crash mid-write) is skipped
    monkeypatch.setenv(KEY_ENV, "sk-test-123")
    with cache.open("a") as handle:
        handle.write('{"key": "abc", "sco')
    third = judge_all(
        [{**ROW, "answer": "Changed."}, ROW], openai_cfg(endpoint.base_url), cache, progress=False
    )
    assert len(endpoint.requests) == 3
    assert third["cached"].to_list() == [False, True]


def test_openai_different_judge_model_is_not_a_cache_hit(endpoint, key, tmp_path) -> None:
    endpoint.replies = [(200, "[RESULT] 2")]
    cache = tmp_path / "c.jsonl"
    judge_all([ROW], openai_cfg(endpoint.base_url), cache, progress=False)
    judge_all([ROW], openai_cfg(endpoint.base_url, model="other-judge"), cache, progress=False)
    assert [r["body"]["model"] for r in endpoint.requests] == ["judge-model", "other-judge"]


@pytest.mark.parametrize(
    ("status", "content", "hint"),
    [
        (401, "Incorrect API key provided. Your request: {headers}", "check the key in $" + KEY_ENV),
        (400, "max_tokens is too large", ""),
        (404, "The model `judge-model` does not exist", "check depth.judge.model"),
    ],
)
def test_openai_deterministic_error_fails_at_once_with_one_redacted_line(
    endpoint, key, tmp_path, status, content, hint
) -> None:
    endpoint.replies = [(status, content)]
    with pytest.raises(TruthflowError) as err:
        judge_all([ROW], openai_cfg(endpoint.base_url), tmp_path / "c.jsonl", progress=False)
    message = str(err.value)
    assert len(endpoint.requests) == 1  # not retried
    assert f"{endpoint.base_url}/chat/completions answered HTTP {status} (not retried)" in message
    assert hint in message and "\n" not in message
    assert key not in message
    if status == 401:  # the echoed header reached the message, masked
        assert "Bearer ***" in message


def test_openai_deterministic_error_stops_every_worker(endpoint, key, tmp_path) -> None:
    endpoint.replies = [(401, "no")]
    rows = [{**ROW, "qid": f"q{i}", "answer": f"Answer {i}."} for i in range(40)]
    with pytest.raises(TruthflowError, match="HTTP 401"):
        judge_all(rows, openai_cfg(endpoint.base_url), tmp_path / "c.jsonl", progress=False)
    assert len(endpoint.requests) <= judge.OPENAI_WORKERS  # only those in flight when the first failed


def test_openai_base_url_from_environment_and_config_overrides_it(
    endpoint, key, monkeypatch, tmp_path
) -> None:
    endpoint.replies = [(200, "[RESULT] 3")]
    monkeypatch.setenv("OPENAI_BASE_URL", endpoint.base_url)
    table = judge_all([ROW], openai_cfg(None), tmp_path / "a.jsonl", progress=False)
    assert table["score"].to_list() == [3] and len(endpoint.requests) == 1
    # a configured base_url wins over the environment: this one has no listener
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    with pytest.raises(TruthflowError, match=re.escape(dead)):
        judge_all([ROW], openai_cfg(dead, retries=0), tmp_path / "b.jsonl", progress=False)
    assert len(endpoint.requests) == 1


def test_openai_keyless_endpoint_never_gets_the_openai_key(endpoint, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-openai-key-do-not-send")
    endpoint.replies = [(200, "[RESULT] 5")]
    judge_all([ROW], openai_cfg(endpoint.base_url, api_key_env=None), tmp_path / "c.jsonl", progress=False)
    [request] = endpoint.requests
    assert "sk-real-openai-key-do-not-send" not in json.dumps(request["headers"])


# ---------------------------------------------------------------- cache key, schema, parse-time check


def test_cache_key_covers_everything_that_can_change_a_verdict(monkeypatch, tmp_path) -> None:
    cfg = {
        "backend": "openai",
        "base_url": "http://127.0.0.1:9/v1",
        "model": "judge-model",
        "api_key_env": KEY_ENV,
    }
    shipped = yaml.safe_load((REPO / "prompts" / "depthqa_judge.yaml").read_text())

    def prompt_file(**edit) -> str:
        path = tmp_path / f"judge{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text(yaml.safe_dump({**shipped, **edit}))
        return str(path)

    def key(row: dict = ROW, **settings) -> str:
        return judge.cache_key(
            judge.judge_method(judge_cfg({**cfg, **settings})),
            row["question"],
            row["answer"],
            row["reference"],
        )

    base = key()
    assert key() == base  # stable
    variants = {
        "question": key({**ROW, "question": "Other?"}),
        "answer": key({**ROW, "answer": "Other."}),
        "reference": key({**ROW, "reference": "Other."}),
        "judge model": key(model="other-judge"),
        "backend": key(backend="hf"),
        "max_new_tokens": key(max_new_tokens=999),
        "rubric": key(prompt=prompt_file(rubric=shipped["rubric"] + " ")),
        "task": key(prompt=prompt_file(task="x" + shipped["task"])),
        "system": key(prompt=prompt_file(system="Be kind.")),
        "sampled": key(decoding={"mode": "sampled"}),
        "temperature": key(decoding={"mode": "sampled", "temperature": 0.7}),
        "top_p": key(decoding={"mode": "sampled", "top_p": 0.9}),
        "seed": key(decoding={"mode": "sampled", "seed": 42}),
    }
    with monkeypatch.context() as m:
        m.setattr(judge, "PARSER_VERSION", judge.PARSER_VERSION + 1)
        variants["PARSER_VERSION"] = key()
    assert base not in variants.values()
    assert len(set(variants.values())) == len(variants)
    # settings that cannot change a verdict keep the key: the endpoint, retries, timeouts, the same prompt
    # text in another file, a greedy decoding's unused sampling settings
    same = prompt_file()
    assert key(base_url="http://elsewhere/v1", retries=0, timeout_s=1, prompt=same) == base
    assert key(decoding={"mode": "greedy", "temperature": 0.5, "seed": 3}) == base


def test_greedy_verdicts_keep_the_keys_they_had_before_prompts_were_files() -> None:
    """The shipped judge prompt is the text the judge held in its code: every cached verdict stays valid."""
    golden = {
        "openai": "a0c942f2f4e0aec0892a2977596abfd5c6773d16299bc0ede34253e52c8f05a3",
        "hf": "98efa2b09fb53493a64811ff764938ff4113f9d998baeb50af0676a094a5bb7a",
        "reference": "4f206dfc88046d9e367b8dca12ccfe98d9f073a919b4b7d8adbfb6a764039208",
    }
    for backend, expected in golden.items():
        cfg = {"backend": backend, "model": {"openai": "judge-model", "hf": "some/dir"}.get(backend)}
        assert judge.cache_key(judge.judge_method(judge_cfg(cfg)), "Q?", "A.", "R.") == expected, backend


def test_parser_change_needs_a_new_parser_version() -> None:
    # cached verdicts were read by parse_verdict: when this fails, bump judge.PARSER_VERSION (old verdicts are
    # then asked again) and update both values here
    source = inspect.getsource(judge.parse_verdict) + judge._RESULT.pattern + judge._INTEGER.pattern
    assert (judge.PARSER_VERSION, hashlib.sha256(source.encode()).hexdigest()[:12]) == (1, PARSER_DIGEST)


def test_judge_code_reads_no_key_outside_the_schema() -> None:
    # the backends read the settings (depth.judge, its defaults filled) by key only
    source = inspect.getsource(judge)
    read = set(re.findall(r"settings\[\"(\w+)\"\]", source))
    assert read and read <= set(schema_defaults("depth", "judge")), read - set(
        schema_defaults("depth", "judge")
    )
    assert "settings.get(" not in source


@pytest.mark.parametrize(
    ("cfg", "environ", "match"),
    [
        ({"backend": "openai", "model": "m"}, {}, r"\$OPENAI_API_KEY is not set \(depth\.judge\.api_key_env"),
        (
            {"backend": "openai", "model": "m", "api_key_env": "MY_KEY"},
            {"OPENAI_API_KEY": "x" * 9},
            r"\$MY_KEY",
        ),
        ({"backend": "openai", "model": "m", "api_key_env": "MY_KEY"}, {"MY_KEY": ""}, r"export MY_KEY="),
        ({"backend": "openai", "api_key_env": "MY_KEY"}, {"MY_KEY": "k"}, r"depth\.judge\.model"),
        ({"backend": "hf"}, {}, r"depth\.judge\.model"),
    ],
)
def test_check_judge_config_names_the_culprit(cfg, environ, match) -> None:
    with pytest.raises(TruthflowError, match=match):
        judge.check_judge_config(judge_cfg(cfg), environ)


def test_unknown_backend_is_refused_by_the_schema() -> None:
    cfg = small_config()
    cfg["depth"]["judge"] = {"backend": "gpt"}
    with pytest.raises(TruthflowError, match=r"^depth\.judge\.backend: 'gpt' is not one of"):
        check_schema(cfg)


@pytest.mark.parametrize(
    "cfg",
    [
        {"backend": "reference"},
        {"backend": "openai", "model": "m", "api_key_env": "MY_KEY"},
        {"backend": "openai", "model": "m", "api_key_env": None},  # a local endpoint without a key
        {"backend": "hf", "model": "some/dir"},
        # several sampled verdicts: the passing side of the refusal of several greedy ones
        {"backend": "reference", "judgments": 3, "decoding": {"mode": "sampled"}},
        {
            "backend": "openai",
            "model": "m",
            "api_key_env": None,
            "judgments": 3,
            "decoding": {"mode": "sampled"},
        },
    ],
)
def test_check_judge_config_passes(cfg) -> None:
    judge.check_judge_config(judge_cfg(cfg), {"MY_KEY": "k"})


def test_hf_judge_chat_template_kwargs_reach_the_prompt_and_the_cache_key(monkeypatch) -> None:
    from truthflow.twins import build_twin

    def key(**settings) -> str:
        method = judge.judge_method(judge_cfg({"backend": "hf", "model": "some/dir", **settings}))
        return judge.cache_key(method, ROW["question"], ROW["answer"], ROW["reference"])

    # unset (or empty) keeps the keys of verdicts cached before the setting existed; set, it is a new key
    assert key(chat_template_kwargs={}) == key()
    assert key(chat_template_kwargs={"enable_thinking": False}) != key()

    template = (
        "{% if enable_thinking is defined and not enable_thinking %}[no-think] {% endif %}"
        "{{ messages[0]['content'] }}"
    )
    # a template that knows enable_thinking gets False unless the config sets it (Qwen3 would think past the
    # verdict's max_new_tokens)
    monkeypatch.setattr(judge.HFJudge, "_load", lambda self: build_twin("llama"))
    for kwargs, expected in (
        ({"enable_thinking": False}, True),
        ({}, True),
        ({"enable_thinking": True}, False),
    ):
        hf = judge.HFJudge(judge_cfg({"backend": "hf", "model": "some/dir", "chat_template_kwargs": kwargs}))
        hf.lm.tokenizer.chat_template = template
        prompt = hf._prompt({"question": "Q?", "answer": "A.", "reference": "R."})
        assert prompt.startswith("[no-think] ") is expected
        assert judge.judge_prompt(hf.settings).system in prompt
