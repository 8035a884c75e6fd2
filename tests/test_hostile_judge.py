"""The openai judge in real Snakemake runs against a local endpoint (127.0.0.1 only): a 401 whose body echoes
the key leaks it nowhere and fails with one line; a failed verdict is never cached, so --forcerun asks again.
(A missing key stopping even a dry run at parse time: tests/test_hostile_config.py.)"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import polars as pl
import pytest
from conftest import checkout_config, copy_run, small_config, snakemake, write_config

from truthflow.depth.judge import OPENAI_WORKERS

KEY_ENV = "TRUTHFLOW_HOSTILE_JUDGE_KEY"
# shaped like no known credential, so only the value-based redaction can hide it
SECRET = "tfkey-7Hq2x9LmWv4Rz8Kp3Nc6"
MODEL = "smollm2-135m"


class Endpoint:
    """/v1/chat/completions on 127.0.0.1; `mode` is (401, _): echo the request, or (200, verdict text)."""

    def __init__(self) -> None:
        self.mode: tuple[int, str] = (200, "[RESULT] 4")
        self.bodies: list[dict] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.bodies.append(body)
                status, text = endpoint.mode
                if status == 401:  # a hostile or careless proxy: the key, raw and in the echoed headers
                    key = self.headers.get("Authorization", "").removeprefix("Bearer ")
                    message = f"Incorrect API key provided: {key}. Request headers: {dict(self.headers)}"
                    payload = {"error": {"message": message, "type": "invalid_request_error"}}
                else:
                    reply = {"role": "assistant", "content": text}
                    payload = {
                        "id": "chatcmpl-x",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body["model"],
                        "choices": [{"index": 0, "finish_reason": "stop", "message": reply}],
                    }
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
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def endpoint():
    server = Endpoint()
    yield server
    server.close()


def depth_config(judge: dict, cfg: dict | None = None) -> dict:
    """Only MODEL's DepthQA with this judge: on the test config (absolute data paths: a temp dir) or on `cfg`
    (checkout_config() in a copy of the shared run)."""
    cfg = cfg or small_config()
    cfg["pathways"]["models"] = []
    cfg["depth"]["models"] = [MODEL]
    cfg["figures"] = {"pathways": [], "depth": [MODEL]}
    cfg["depth"]["judge"] = judge
    return cfg


def openai_judge(base_url: str, **extra) -> dict:
    return {
        "backend": "openai",
        "model": "judge-model",
        "base_url": base_url,
        "api_key_env": KEY_ENV,
        **extra,
    }


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, pristine_run) -> Path:
    """A copy of the shared run (this model's DepthQA answers are made there), for the judge runs."""
    return copy_run(pristine_run, tmp_path_factory.mktemp("hostile"))


def scores_target(work: Path) -> str:
    run = small_config()["run"]
    return f"results/{run}/depth/{MODEL}/scores.parquet"


def test_401_echoing_the_key_leaks_it_nowhere_and_fails_with_one_line(workdir, endpoint, monkeypatch) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    endpoint.mode = (401, "")
    write_config(workdir, depth_config(openai_judge(endpoint.base_url), checkout_config()))
    proc = snakemake(workdir, scores_target(workdir), "--forcerun", "judge_answers")
    assert proc.returncode != 0
    assert endpoint.bodies, "the endpoint was never asked"

    rule_log = workdir / "results" / small_config()["run"] / "logs" / "judge_answers" / f"{MODEL}.log"
    places = {
        "snakemake stdout": proc.stdout,
        "snakemake stderr": proc.stderr,
        str(rule_log): rule_log.read_text(),
    }
    for path in (workdir / ".snakemake" / "log").rglob("*"):
        if path.is_file():
            places[str(path)] = path.read_text(errors="replace")
    assert len(places) > 3, "no .snakemake/log file to check"
    for where, text in places.items():
        assert SECRET not in text, f"the API key reached {where}"

    # one line from the job (snakemake's show-failed-logs prints the rule log again: the same line)
    [error] = {line for line in proc.stderr.splitlines() if "truthflow error" in line}
    assert f"judge endpoint {endpoint.base_url}/chat/completions answered HTTP 401" in error
    assert f"${KEY_ENV}" in error
    log_errors = [line for line in rule_log.read_text().splitlines() if "truthflow error" in line]
    assert log_errors == [error]
    assert "Traceback" not in rule_log.read_text()
    # deterministic: not retried; at most one request per worker was in flight when the first one failed
    assert len(endpoint.bodies) <= OPENAI_WORKERS
    prompts = [b["messages"][-1]["content"] for b in endpoint.bodies]
    assert len(set(prompts)) == len(prompts)


def test_failed_verdicts_are_not_cached_and_forcerun_asks_again(workdir, endpoint, monkeypatch) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    cache = workdir / "resources" / "judge_cache" / f"{MODEL}.jsonl"
    cache.unlink(missing_ok=True)
    write_config(workdir, depth_config(openai_judge(endpoint.base_url), checkout_config()))
    target = scores_target(workdir)

    endpoint.mode = (200, "I cannot grade this.")
    proc = snakemake(workdir, target, "--forcerun", "judge_answers")
    assert proc.returncode == 0, proc.stderr[-4000:]
    scores = pl.read_parquet(workdir / target)
    n = scores.height
    assert n > 0 and scores["score"].null_count() == n
    assert len(endpoint.bodies) == n
    assert not cache.exists() or cache.read_text() == ""

    endpoint.mode = (200, "Feedback: fine. [RESULT] 4")
    proc = snakemake(workdir, target, "--forcerun", "judge_answers")
    assert proc.returncode == 0, proc.stderr[-4000:]
    scores = pl.read_parquet(workdir / target)
    assert scores["score"].to_list() == [4] * n
    assert len(endpoint.bodies) == 2 * n  # every failed verdict asked again
    assert len(cache.read_text().splitlines()) == n

    # a third forced run finds every verdict cached: no request
    proc = snakemake(workdir, target, "--forcerun", "judge_answers")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert len(endpoint.bodies) == 2 * n
