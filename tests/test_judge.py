"""Judges (METHOD B3): token-F1 reference backend by hand, OpenAI backend against a real local server."""

from __future__ import annotations

import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import polars as pl
import pytest

from truthflow.errors import TruthflowError
from truthflow.judge import f1_to_score, judge_all, normalize_text, parse_verdict, read_cache, token_f1

KEY_ENV = "TRUTHFLOW_TEST_JUDGE_KEY"
ROW = {"qid": "d1_q1", "question": "What is a thylakoid?", "answer": "A membrane sac.", "reference": "A sac."}


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
    first = judge_all(rows, {"backend": "reference"}, cache, progress=False)
    assert first.schema == pl.Schema(
        {"qid": pl.Utf8, "score": pl.Int64, "reason": pl.Utf8, "backend": pl.Utf8, "cached": pl.Boolean}
    )
    # "membrane sac" vs "sac": P = 1/2, R = 1, F1 = 2/3 → 1 + round(2.67) = 4
    assert first["score"].to_list() == [4, 1]
    assert first["cached"].to_list() == [False, False]
    second = judge_all(rows, {"backend": "reference"}, cache, progress=False)
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


def test_bad_backend_name_is_a_user_error(tmp_path) -> None:
    with pytest.raises(TruthflowError, match="gpt-judge"):
        judge_all([ROW], {"backend": "gpt-judge"}, tmp_path / "c.jsonl")


# ---------------------------------------------------------------- openai backend on a real local HTTP server


class FakeEndpoint:
    """An OpenAI-compatible /v1/chat/completions on 127.0.0.1; answers the queued replies in turn."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.replies: list[tuple[int, str]] = []
        self.lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with endpoint.lock:
                    endpoint.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                    status, content = (
                        endpoint.replies.pop(0) if len(endpoint.replies) > 1 else endpoint.replies[0]
                    )
                if status == 200:
                    payload = {
                        "id": "chatcmpl-test", "object": "chat.completion", "model": body["model"],
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": content}}],
                    }  # fmt: skip
                else:
                    payload = {"error": {"message": content}}
                data = json.dumps(payload).encode()
                self.send_response(status)
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
    return {"backend": "openai", "base_url": base_url, "model": "judge-model", "api_key_env": KEY_ENV,
            "backoff_s": 0.01, **extra}  # fmt: skip


def test_openai_good_verdict(endpoint, key, tmp_path) -> None:
    endpoint.replies = [(200, "Feedback: The response matches the reference. [RESULT] 4")]
    table = judge_all([ROW], openai_cfg(endpoint.base_url), tmp_path / "c.jsonl", progress=False)
    assert table.row(0, named=True) == {
        "qid": "d1_q1", "score": 4, "reason": "The response matches the reference.", "backend": "openai",
        "cached": False,
    }  # fmt: skip
    [request] = endpoint.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == f"Bearer {key}"
    body = request["body"]
    assert body["model"] == "judge-model" and body["temperature"] == 0 and body["max_tokens"] > 0
    prompt = body["messages"][-1]["content"]
    for part in (ROW["question"], ROW["answer"], ROW["reference"], "[RESULT]"):
        assert part in prompt


def test_openai_malformed_verdict_is_retried_then_missing(endpoint, key, tmp_path) -> None:
    endpoint.replies = [(200, "I would rather not grade this answer today.")]
    cache = tmp_path / "c.jsonl"
    table = judge_all([ROW], openai_cfg(endpoint.base_url, max_retries=2), cache, progress=False)
    assert len(endpoint.requests) == 3  # first try and two retries
    assert table["score"].to_list() == [None]
    assert table["reason"][0] == "unparseable verdict: I would rather not grade this answer today."
    # the missing verdict is cached too: a rerun does not ask again
    again = judge_all([ROW], openai_cfg(endpoint.base_url, max_retries=2), cache, progress=False)
    assert len(endpoint.requests) == 3
    assert again["cached"].to_list() == [True] and again["score"].to_list() == [None]


def test_openai_rate_limit_is_retried(endpoint, key, tmp_path) -> None:
    endpoint.replies = [(429, "slow down"), (503, "busy"), (200, "[RESULT] 5")]
    table = judge_all([ROW], openai_cfg(endpoint.base_url), tmp_path / "c.jsonl", progress=False)
    assert table["score"].to_list() == [5]
    assert len(endpoint.requests) == 3


def test_openai_persistent_server_error_names_the_url(endpoint, key, tmp_path) -> None:
    endpoint.replies = [(500, "broken")]
    cache = tmp_path / "c.jsonl"
    with pytest.raises(TruthflowError, match=re.escape(endpoint.base_url + "/chat/completions")):
        judge_all([ROW], openai_cfg(endpoint.base_url, http_retries=2), cache, progress=False)
    assert len(endpoint.requests) == 3
    assert read_cache(cache) == {}  # an outage is no verdict: nothing cached, the rerun asks again


def test_openai_refused_connection_names_the_url(key, tmp_path) -> None:
    with socket.socket() as sock:  # a port that was free a moment ago and now has no listener
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base_url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(TruthflowError, match=re.escape(base_url)):
        judge_all([ROW], openai_cfg(base_url), tmp_path / "c.jsonl", progress=False)


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
    first = judge_all(rows, openai_cfg(endpoint.base_url, workers=2), cache, progress=False)
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
