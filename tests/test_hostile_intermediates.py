"""Hostile intermediates and interrupted jobs (issue 12 #11, #13, #14): a truncated, corrupted or foreign file
in results/ fails the stage that reads it with one line naming the file, what is wrong and how to rebuild it;
following that line rebuilds it. A job stops with one line on SIGTERM or SIGINT, and dies with the snakemake
process that started it (Snakemake removes the outputs of a failed or killed job: test_robustness.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import polars as pl
import psutil
import pytest
from conftest import copy_run, snakemake

from truthflow import validate
from truthflow.errors import TruthflowError

RUN = Path("results/demo")
NPY = "results/demo/pathways/smollm2-135m/nq/resid_ko.npy"


# ------------------------------------------------------------------------------------------ readers
@pytest.fixture
def frame() -> pl.DataFrame:
    return pl.DataFrame({"id": ["a", "b", "c"], "correct": [True, False, True], "n": [1, 2, 3]})


def _parquet(tmp_path, frame, rel="results/demo/labels/m/nq.parquet") -> Path:
    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.write_parquet(path)
    return path


def _error(fn, *args, **kwargs) -> str:
    with pytest.raises(TruthflowError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_parquet_cut_in_half_names_file_and_rebuild_command(tmp_path, frame):
    path = _parquet(tmp_path, frame)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    message = _error(validate.read_parquet, path, ["id"])
    assert message.startswith(f"{path.as_posix()}: unreadable parquet (")
    assert message.endswith(f" — rebuild it with: snakemake --forcerun {path}")


def test_corrupted_parquet_is_one_line(tmp_path):
    frame = pl.DataFrame({"id": [f"q{i}" for i in range(2000)], "x": np.arange(2000.0)})
    path = _parquet(tmp_path, frame)
    data = bytearray(path.read_bytes())
    data[100:400] = b"\xff" * 300
    path.write_bytes(bytes(data))
    assert "unreadable parquet (" in _error(validate.read_parquet, path, ["id"])


def test_parquet_columns_are_checked(tmp_path, frame):
    expected = "missing column answer (has: id, correct, n)"
    assert f": {expected} — rebuild it with: snakemake --forcerun" in _error(
        validate.read_parquet, _parquet(tmp_path, frame), ["id", "answer"]
    )


@pytest.mark.parametrize("content", [b"", b"id\tx\n"], ids=["empty", "foreign"])
def test_empty_or_foreign_parquet(tmp_path, content):
    path = tmp_path / "x.parquet"
    path.write_bytes(content)
    assert _error(validate.read_parquet, path).startswith(f"{path.as_posix()}: unreadable parquet (parquet: ")


def test_a_file_outside_results_gets_no_rebuild_hint(tmp_path, frame):
    path = _parquet(tmp_path, frame, "elsewhere/x.parquet")
    message = _error(validate.read_parquet, path, ["answer"])
    assert "rebuild" not in message and message.startswith(f"{path.as_posix()}: missing column answer")


def _npy(tmp_path, shape=(5, 3, 4), dtype=np.float16, rel=NPY) -> Path:
    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, np.arange(np.prod(shape)).reshape(shape).astype(dtype))
    return path


def test_truncated_npy_names_file_and_rebuild_command(tmp_path):
    path = _npy(tmp_path)
    os.truncate(path, path.stat().st_size - 10)
    message = _error(validate.load_npy, path, (5, None, None), "float16")
    assert message == (
        f"{path.as_posix()}: unreadable .npy (mmap length is greater than file size)"
        f" — rebuild it with: snakemake --forcerun {path.as_posix()}"
    )


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (
            {"shape": (6, None, None), "dtype": "float16"},
            "shape [5, 3, 4] float16, expected [6, 3, 4] float16",
        ),
        ({"shape": (5, 3, 4), "dtype": "float32"}, "shape [5, 3, 4] float16, expected [5, 3, 4] float32"),
        ({"shape": (None,) * 4}, "shape [5, 3, 4] float16, expected [*, *, *, *] float16"),
    ],
)
def test_npy_shape_and_dtype_are_checked(tmp_path, kwargs, expected):
    assert f": {expected}" in _error(validate.load_npy, _npy(tmp_path), **kwargs)


def test_npy_with_trailing_bytes_or_broken_header(tmp_path):
    path = _npy(tmp_path)
    with path.open("ab") as fh:
        fh.write(b"\0" * 8)
    assert "8 bytes after the end of its [5, 3, 4] float16 array" in _error(validate.load_npy, path)
    path.write_bytes(b"\x93NUMPY garbage")
    assert "unreadable .npy (" in _error(validate.load_npy, path)


def test_good_files_are_read(tmp_path, frame):
    assert validate.read_parquet(_parquet(tmp_path, frame), ["id", "correct"]).equals(frame)
    arr = validate.load_npy(_npy(tmp_path), (5, None, None), "float16")
    assert isinstance(arr, np.memmap) and arr.shape == (5, 3, 4)
    empty = tmp_path / "results/demo/pathways/m/nq/resid_clean.npy"
    empty.parent.mkdir(parents=True)
    np.save(empty, np.zeros((0, 3, 4), dtype=np.float16))  # no kept samples
    assert validate.load_npy(empty, (0, None, None), "float16").shape == (0, 3, 4)


def test_tsv_cut_mid_line_or_ragged(tmp_path):
    path = tmp_path / "results/demo/labels/m/nq.accuracy.tsv"
    path.parent.mkdir(parents=True)
    path.write_text("model\tdataset\tn\taccuracy\nm\tnq\t40\t0.5\n")
    assert validate.read_tsv(path, ["accuracy"]).height == 1
    path.write_text("model\tdataset\tn\taccuracy\nm\tnq\t4")
    assert "unreadable TSV (truncated: the last line has no line end) — rebuild it with" in _error(
        validate.read_tsv, path
    )
    path.write_text("model\tdataset\tn\taccuracy\nm\tnq\t40\n")
    assert "line 2 has 3 fields, the header 4" in _error(validate.read_tsv, path)


def test_ids_from_other_data(tmp_path, frame):
    message = _error(
        validate.check_ids, frame, "results/demo/answers/m/nq.parquet", "id", ["a", "b"], "d.parquet"
    )
    assert message.startswith(
        "results/demo/answers/m/nq.parquet: 1 of its 3 ids are not in d.parquet (first: 'c')"
    )
    assert message.endswith("— rebuild it with: snakemake --forcerun results/demo/answers/m/nq.parquet")


# ------------------------------------------------------------------- jobs die with snakemake (#14)
JOB = textwrap.dedent(
    """
    import sys, time
    from types import SimpleNamespace
    from truthflow import runlog

    def main(sm):
        print("writing", flush=True)
        time.sleep(120)

    runlog.run(SimpleNamespace(log=[sys.argv[2]], rule="slow_rule", output=[sys.argv[1]]), main)
    """
)


def _job_cmd(tmp_path) -> list[str]:
    (tmp_path / "job.py").write_text(JOB)
    return [sys.executable, str(tmp_path / "job.py"), str(tmp_path / "out.npy"), str(tmp_path / "job.log")]


def _gone(job: psutil.Process, timeout: float = 10) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if job.status() == psutil.STATUS_ZOMBIE:  # exited; its new parent has not reaped it yet
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_a_job_with_one_line(tmp_path, sig):
    job = subprocess.Popen(_job_cmd(tmp_path), stdout=subprocess.PIPE, text=True)
    assert job.stdout.readline() == "writing\n"
    job.send_signal(sig)
    assert job.wait(timeout=10) == 128 + sig
    log = (tmp_path / "job.log").read_text()
    assert f"truthflow: rule slow_rule stopped by {sig.name}\n" in log
    assert "Traceback" not in log


LAUNCHER = textwrap.dedent(
    """
    import subprocess, sys
    job = subprocess.Popen(sys.argv[2:], shell=sys.argv[1] == "shell", stdout=subprocess.PIPE, text=True)
    print(job.stdout.readline(), end="", flush=True)
    job.wait()
    """
)


@pytest.mark.parametrize("between", ["nothing", "shell"])
def test_a_job_dies_with_the_snakemake_that_started_it(tmp_path, between):
    """SIGKILL of the parent (named snakemake, like the real one): the job's watch sees its side of the
    process tree (itself, or a shell in between: conda activation) reparented, and stops the job."""
    launcher = tmp_path / "snakemake"
    launcher.write_text(LAUNCHER)
    cmd = _job_cmd(tmp_path)
    args = ["shell", " ".join(cmd) + "; echo shell-after"] if between == "shell" else ["direct", *cmd]
    parent = subprocess.Popen([sys.executable, str(launcher), *args], stdout=subprocess.PIPE, text=True)
    assert parent.stdout.readline() == "writing\n"
    children = psutil.Process(parent.pid).children(recursive=True)
    [job] = [p for p in children if "job.py" in " ".join(p.cmdline()[:2])]
    parent.kill()
    parent.wait()
    assert _gone(job), "the job outlived the snakemake that started it"
    assert "stopped by SIGTERM" in (tmp_path / "job.log").read_text()


# ---------------------------------------------------------------------------- in the real workflow
def _one_line_failure(proc, rule: str) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    lines = [line for line in out.splitlines() if line.startswith(f"truthflow error in rule {rule}: ")]
    assert lines, out[-3000:]
    return lines[0].removeprefix(f"truthflow error in rule {rule}: ")


def _cut(path: Path, keep: float = 0.5) -> None:
    os.truncate(path, int(path.stat().st_size * keep))


def _drop_rows(path: Path) -> None:
    """One sample fewer: the resid files are stored [L, N, D], so a sample is a row of axis 1."""
    arr = np.load(path)
    np.save(path, arr[:, :-1])


def _drop_column(path: Path) -> None:
    pl.read_parquet(path).drop("answer").write_parquet(path)


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 3 : len(data) // 3 + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))


def _drop_first_row(path: Path) -> None:
    pl.read_parquet(path).slice(1).write_parquet(path)


def _cut_tsv(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-3])


PW = "results/demo/pathways/smollm2-135m/nq"
CASES = {
    # file broken, how, the rule that reads it, the message after "<path>: "
    "npy truncated": (f"{PW}/resid_ko.npy", _cut, "probe_deltap", "unreadable .npy ("),
    "npy one row short": (f"{PW}/resid_clean.npy", _drop_rows, "probe_deltap", "shape ["),
    "parquet cut in half": (
        "results/demo/labels/smollm2-135m/nq.parquet",
        _cut,
        "extract_pathways",
        "unreadable parquet (",
    ),
    "parquet corrupted": (f"{PW}/samples.parquet", _corrupt, "probe_deltap", "unreadable parquet"),
    "parquet row gone": (f"{PW}/saliency.parquet", _drop_first_row, "extract_experiments", "1 of the "),
    "parquet column gone": (
        "results/demo/answers/smollm2-135m/nq.parquet",
        _drop_column,
        "label_answers",
        "missing",
    ),
    "tsv cut": (
        "results/demo/labels/smollm2-135m/nq.accuracy.tsv",
        _cut_tsv,
        "accuracy_table",
        "unreadable TSV (truncated",
    ),
}


@pytest.mark.workflow
@pytest.mark.model
@pytest.mark.parametrize("case", list(CASES))
def test_broken_intermediate_fails_the_next_stage_with_one_line(pristine_run, tmp_path, case):
    rel, damage, reader, what = CASES[case]
    workdir = copy_run(pristine_run, tmp_path)
    damage(workdir / rel)
    proc = snakemake(workdir)
    message = _one_line_failure(proc, reader)
    assert message.startswith(f"{rel}: {what}"), message
    assert message.endswith(f" — rebuild it with: snakemake --forcerun {rel}"), message


@pytest.mark.workflow
@pytest.mark.model
def test_following_the_rebuild_line_restores_the_tables(pristine_run, tmp_path):
    rel = "results/demo/depth/smollm2-135m/mink.parquet"
    workdir = copy_run(pristine_run, tmp_path)
    _cut(workdir / rel)
    message = _one_line_failure(snakemake(workdir), "depth_tables")
    command = message.split("rebuild it with: ")[1].split()
    assert command[:2] == ["snakemake", "--forcerun"]
    done = snakemake(workdir, *command[1:])
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("depth_per_question.parquet", "depth_depthwise.parquet", "depth_score_gaps.parquet"):
        ours, ref = (pl.read_parquet(w / RUN / "tables" / name) for w in (workdir, pristine_run))
        assert ours.equals(ref), name
    assert (workdir / RUN / "tables/depth_pooled_by_depth.tsv").read_bytes() == (
        pristine_run / RUN / "tables/depth_pooled_by_depth.tsv"
    ).read_bytes()
