"""runlog.run: both streams reach the rule log, progress bars stay readable there, errors are one line, and
no secret reaches the terminal or the log (`redact`)."""

from __future__ import annotations

import io
import logging
import subprocess
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


class _FakeCuda:
    """torch.cuda of a job that used two devices, peaks 1 MiB and 3 MiB."""

    peaks = {0: 2**20, 1: 3 * 2**20}

    def is_initialized(self) -> bool:
        return True

    def device_count(self) -> int:
        return len(self.peaks)

    def max_memory_allocated(self, device: int) -> int:
        return self.peaks[device]


@pytest.mark.parametrize(("torch", "expected"), [(None, None), (SimpleNamespace(cuda=_FakeCuda()), 4.0)])
def test_a_model_job_writes_its_peak_gpu_memory(tmp_path, monkeypatch, torch, expected) -> None:
    """Snakemake's `benchmark:` samples processes, which never see GPU memory: the job writes torch's peak,
    summed over its devices (1 + 3 MiB), or NA where it loaded no CUDA."""
    import polars as pl

    monkeypatch.setitem(sys.modules, "torch", torch)  # None: a job that never imported torch
    out = tmp_path / "job.peaks.tsv"
    sm = SimpleNamespace(log=[], rule="r", output=SimpleNamespace(peaks=str(out)))
    assert run(sm, lambda sm: None) == 0
    peaks = pl.read_csv(out, separator="\t", null_values="NA", schema_overrides={"max_gpu_mb": pl.Float64})
    assert peaks.columns == ["cpu_seconds", "max_rss_mb", "max_gpu_mb"]
    assert peaks["max_gpu_mb"].to_list() == [expected]
    assert peaks["max_rss_mb"][0] > 0


ALLOCATE_MB = 300
# a job that holds ALLOCATE_MB for a moment, far less than any sampling interval: in its own process, or in a
# child it waits for; b"1" * n writes every page, so all of them are resident at once
PEAK_JOB = f"""
import subprocess, sys
from types import SimpleNamespace
from truthflow import runlog
HOLD = "held = b'1' * ({ALLOCATE_MB} * 2**20); del held"

def main(sm):
    if sys.argv[2] == "child":
        subprocess.run([sys.executable, "-c", HOLD], check=True)
    else:
        exec(HOLD)

runlog.run(SimpleNamespace(log=[], rule="r", output=SimpleNamespace(peaks=sys.argv[1])), main)
"""


@pytest.mark.parametrize("where", ["self", "child"])
def test_a_jobs_peak_rss_is_exact_however_brief(tmp_path, where) -> None:
    """A fresh process (tens of MB before it allocates) that holds 300 MB for a moment records a peak of at
    least 300 MB, whenever the moment falls: no sampling interval decides it. A child's peak counts too
    (a job's tokenizer or loader processes)."""
    import polars as pl

    out = tmp_path / "job.peaks.tsv"
    proc = subprocess.run(
        [sys.executable, "-c", PEAK_JOB, str(out), where], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    peak = pl.read_csv(out, separator="\t", null_values="NA")["max_rss_mb"][0]
    assert peak >= ALLOCATE_MB, peak


CPU_JOB = """
import subprocess, sys
from types import SimpleNamespace
from truthflow import runlog
SPIN = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.5: pass"

def main(sm):
    subprocess.run([sys.executable, "-c", SPIN], check=True)
    exec(SPIN)

runlog.run(SimpleNamespace(log=[], rule="r", output=SimpleNamespace(peaks=sys.argv[1])), main)
"""


def test_a_jobs_cpu_seconds_are_exact_and_count_its_children(tmp_path) -> None:
    """A job that spins 0.5 CPU-s itself and 0.5 CPU-s in a child it waits for records at least 1.0 CPU-s:
    counted by the kernel, not by samples of the process tree (which miss a child that ends between two)."""
    import polars as pl

    out = tmp_path / "job.peaks.tsv"
    proc = subprocess.run(
        [sys.executable, "-c", CPU_JOB, str(out)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert pl.read_csv(out, separator="\t", null_values="NA")["cpu_seconds"][0] >= 1.0


WORKERS_JOB = """
import sys, time
from types import SimpleNamespace
from joblib import Parallel, delayed
from truthflow import runlog

def spin(i):
    t = time.process_time()
    while time.process_time() - t < 0.5:
        pass

def main(sm):
    Parallel(n_jobs=2)(delayed(spin)(i) for i in range(2))

runlog.run(SimpleNamespace(log=[], rule="r", output=SimpleNamespace(peaks=sys.argv[1])), main)
"""


def test_peaks_count_the_cpu_of_workers_still_alive(tmp_path) -> None:
    """An analysis job's layers run in joblib's workers (`probes.over_layers`), which are still alive, never
    waited for, when the job writes its peaks: their 2 x 0.5 CPU-s count all the same."""
    import polars as pl

    out = tmp_path / "job.peaks.tsv"
    proc = subprocess.run(
        [sys.executable, "-c", WORKERS_JOB, str(out)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert pl.read_csv(out, separator="\t", null_values="NA")["cpu_seconds"][0] >= 1.0


def test_the_benchmark_table_joins_snakemakes_benchmark_and_the_jobs_peaks(tmp_path) -> None:
    """A row per job: its rule and wildcards, an analysis job's shape (NA for a model job), wall s from the
    file Snakemake's `benchmark:` writes (its own header, so a renamed column fails here), the exact CPU s,
    RSS and GPU peaks from the job's own file, then Snakemake's sampled CPU s and RSS, named as sampled."""
    from snakemake.benchmark import BenchmarkRecord

    header = BenchmarkRecord.get_header()

    def benchmark_file(name: str, values: dict[str, str]) -> str:
        path = tmp_path / name
        path.write_text("\t".join(header) + "\n" + "\t".join(values.get(c, "NA") for c in header) + "\n")
        return str(path)

    bench = benchmark_file("bench.tsv", {"s": "12.5", "max_rss": "1234.5", "cpu_time": "20.25"})
    quick = benchmark_file("quick.tsv", {"s": "0.3"})  # a job that ended before Snakemake's first sample
    gpu, none = tmp_path / "a.peaks.tsv", tmp_path / "b.peaks.tsv"
    gpu.write_text("cpu_seconds\tmax_rss_mb\tmax_gpu_mb\n21.50\t2048.50\t512.00\n")
    none.write_text("cpu_seconds\tmax_rss_mb\tmax_gpu_mb\n0.40\t96.25\tNA\n")
    shape = {"n": 100, "layers": 2, "hidden": 8, "fits": 15, "threads": 1}  # an analysis job's
    jobs = [
        {"rule": "extract_pathways", "model": "m", "dataset": "nq"},
        {"rule": "probe_deltap", "model": "m", "dataset": "x", **shape},
    ]

    table = runlog.benchmark_table([bench, quick], [str(gpu), str(none)], jobs)
    assert table.columns == [
        *("rule", "model", "dataset", "n", "layers", "hidden", "fits", "threads", "seconds", "cpu_seconds"),
        *("max_rss_mb", "max_gpu_mb", "sampled_cpu_seconds", "sampled_max_rss_mb"),
    ]
    no_shape = (None,) * 5
    assert table.row(0) == (
        "extract_pathways",
        "m",
        "nq",
        *no_shape,
        12.5,
        21.5,
        2048.5,
        512.0,
        20.25,
        1234.5,
    )
    assert table.row(1) == ("probe_deltap", "m", "x", 100, 2, 8, 15, 1, 0.3, 0.4, 96.25, None, None, None)
