"""runlog.run: both streams reach the rule log, progress bars stay readable there, errors are one line, and
no secret reaches the terminal or the log (`redact`)."""

from __future__ import annotations

import io
import logging
import sys
from types import SimpleNamespace

import pytest
from tqdm import tqdm

from truthflow import redact as redact_mod
from truthflow import runlog
from truthflow.errors import TruthflowError
from truthflow.redact import redact

SECRET = "tf-secret-0123456789abcdef"


def fake_snakemake(tmp_path, rule: str = "demo_rule") -> SimpleNamespace:
    return SimpleNamespace(log=[str(tmp_path / "logs" / f"{rule}.log")], rule=rule)


def run(sm, main) -> int:
    try:
        runlog.run(sm, main)
    except SystemExit as exc:
        return int(exc.code)
    return 0


def test_stdout_stderr_and_logging_all_reach_the_log(tmp_path, capsys) -> None:
    def main(sm) -> None:
        print("to stdout")
        print("to stderr", file=sys.stderr)
        logging.getLogger("truthflow.test").info("a log record")
        sys.stdout.write("no newline at the end")

    sm = fake_snakemake(tmp_path)
    assert run(sm, main) == 0
    log = open(sm.log[0]).read()
    for text in ("to stdout", "to stderr", "a log record", "no newline at the end"):
        assert text in log
    out, err = capsys.readouterr()  # the terminal still gets everything
    assert "to stdout" in out and "no newline at the end" in out and "to stderr" in err
    assert sys.stdout is not None and not isinstance(sys.stdout, runlog._Tee)  # streams restored


def test_a_rule_without_a_log_still_runs_redacted(monkeypatch, capsys) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    assert run(SimpleNamespace(log=[], rule="r"), lambda sm: print(f"key {SECRET}")) == 0
    assert capsys.readouterr().out == "key ***\n"


def test_progress_bar_leaves_a_few_readable_lines(tmp_path, capsys) -> None:
    def main(sm) -> None:
        for _ in tqdm(range(3000), desc="judging", mininterval=0, miniters=1):
            pass
        print("done")

    sm = fake_snakemake(tmp_path)
    assert run(sm, main) == 0
    log = open(sm.log[0]).read()
    assert "\r" not in log
    lines = log.splitlines()
    # the bar's final state, "done" (no interval passed) and the job's closing line
    assert len(lines) <= 4, lines
    assert "3000/3000" in lines[0] and lines[-2] == "done"
    assert lines[-1].startswith(f"rule {sm.rule}: done in ") and "wrote" in lines[-1]
    assert capsys.readouterr().err.count("\r") > 100  # the terminal keeps its live bar


def test_log_lines_keep_the_final_state_and_one_state_per_interval() -> None:
    now = [0.0]
    handle = io.StringIO()
    lines = runlog._Tee(io.StringIO(), handle, interval=30, clock=lambda: now[0])
    lines.write("header\n")
    for i in range(1, 101):  # a bar redrawn every second for 100 s
        now[0] = float(i)
        lines.write(f"\rbar {i:3d}/100   ")
    lines.write("\n")
    lines.write("a\r\nb\n\nc")  # \r\n is a line end; an empty line stays; an unfinished line waits for close
    assert "c" not in handle.getvalue()
    lines.close()
    written = handle.getvalue().splitlines()
    assert written[0] == "header"
    bars = [w for w in written if w.startswith("bar")]
    assert 3 <= len(bars) <= 5 and bars[-1] == "bar 100/100"  # about one per 30 s, then the final one
    assert written[-4:] == ["a", "b", "", "c"]


def test_truthflow_error_is_one_line_without_traceback(tmp_path, capsys) -> None:
    def main(sm) -> None:
        raise TruthflowError("config key depth.judge.model is wrong")

    sm = fake_snakemake(tmp_path, "judge_answers")
    assert run(sm, main) == 1
    err = capsys.readouterr().err
    assert err == "truthflow error in rule judge_answers: config key depth.judge.model is wrong\n"
    assert open(sm.log[0]).read() == err


def test_secrets_never_reach_the_terminal_or_the_log(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setattr(redact_mod, "_registered", set())
    redact_mod.add_secret("registered-secret-value")

    def main(sm) -> None:
        print("Authorization: Bearer abc.def-123", flush=True)
        sys.stderr.write(SECRET[:10])  # a secret written in pieces
        sys.stderr.write(SECRET[10:] + "\n")
        print("openai key sk-proj-AbCdEf123456 and hf_AbCdEfGhIjKlMn and registered-secret-value")
        logging.getLogger("x").warning("header %s", {"authorization": f"Bearer {SECRET}"})
        raise RuntimeError(f"unexpected: {SECRET}")

    sm = fake_snakemake(tmp_path)
    assert run(sm, main) == 1
    out, err = capsys.readouterr()
    log = open(sm.log[0]).read()
    for text in (out, err, log):
        assert SECRET not in text and "abc.def-123" not in text and "registered-secret-value" not in text
        assert "sk-proj-AbCdEf123456" not in text and "hf_AbCdEfGhIjKlMn" not in text
    assert "Bearer ***" in out and "RuntimeError: unexpected: ***" in err
    assert err.count("Traceback") == 1 and log.count("Traceback") == 1  # printed once, redacted


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Authorization: Bearer sk-abcdefghijkl", "Authorization: Bearer ***"),
        ("'authorization': 'bearer xyz.123'", "'authorization': 'bearer ***'"),
        ("key=sk-proj_abc-DEF123456", "key=sk-***"),
        ("token hf_abcdefghijklmnop", "token hf_***"),
        (
            "a task-abcdefghij, risk-free, sk-12 and Bearer of news",
            "a task-abcdefghij, risk-free, sk-12 and Bearer of news",
        ),
    ],
)
def test_redact_patterns(text: str, expected: str) -> None:
    assert redact(text, environ={}) == expected


def test_redact_env_values_but_not_short_placeholders() -> None:
    environ = {"OPENAI_API_KEY": "plainkey-without-prefix", "HUGGING_FACE_HUB_TOKEN": "none"}
    assert redact("a plainkey-without-prefix b none", environ=environ) == "a *** b none"


def test_a_model_job_writes_its_own_benchmark_with_exact_peaks(tmp_path) -> None:
    """The benchmark output holds the process's own peaks, read as the job ends: a job that touches 300 MiB
    reports at least that much, CPU seconds at least those it burned, and NA for GPU memory on a CPU."""
    import numpy as np
    import polars as pl
    from snakemake.iocontainers import Namedlist

    bench = tmp_path / "benchmarks" / "job.tsv"
    bench.parent.mkdir()
    sm = SimpleNamespace(log=[], rule="r", output=Namedlist(fromdict={"benchmark": str(bench)}))
    burned = {}

    def main(sm) -> None:
        start = __import__("time").process_time()
        assert np.ones(300 * 2**20 // 8).sum() > 0  # 300 MiB written, so resident
        burned["cpu"] = __import__("time").process_time() - start

    assert run(sm, main) == 0
    row = pl.read_csv(bench, separator="\t", null_values="NA").row(0, named=True)
    assert row["max_rss_mb"] >= 300 and row["cpu_seconds"] >= burned["cpu"] > 0 and row["seconds"] > 0
    assert row["max_gpu_mb"] is None
