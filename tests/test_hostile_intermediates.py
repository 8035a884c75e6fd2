"""Hostile intermediates and interrupted jobs (issue 12 #11, #13, #14): a truncated, corrupted or foreign file
in results/ fails the stage that reads it with one line naming the file, what is wrong and how to rebuild it;
following that line rebuilds it. Partial files of killed jobs are removed when the job next starts; a job
stopped by SIGTERM removes its own; a job dies with the snakemake process that started it."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
from conftest import copy_run, snakemake

from truthflow import runlog, validate
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


def test_parquet_cut_in_half_names_file_and_rule(tmp_path, frame):
    path = _parquet(tmp_path, frame)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    message = _error(validate.read_parquet, path, ["id"])
    assert message.startswith(f"{path.as_posix()}: truncated: ")
    assert message.endswith(f" — written by rule label_answers; rebuild it with: snakemake --forcerun {path}")


def test_corrupted_parquet_is_one_line(tmp_path):
    frame = pl.DataFrame({"id": [f"q{i}" for i in range(2000)], "x": np.arange(2000.0)})
    path = _parquet(tmp_path, frame)
    data = bytearray(path.read_bytes())
    data[100:400] = b"\xff" * 300
    path.write_bytes(bytes(data))
    assert "unreadable parquet (" in _error(validate.read_parquet, path, ["id"])


@pytest.mark.parametrize(
    ("required", "expected"),
    [
        (["id", "answer"], "missing column answer (has: id, correct, n)"),
        ({"id": pl.String, "correct": pl.String}, "column correct is Boolean, expected String"),
    ],
)
def test_parquet_schema_is_checked(tmp_path, frame, required, expected):
    assert f": {expected} — written by rule label_answers" in _error(
        validate.read_parquet, _parquet(tmp_path, frame), required
    )


@pytest.mark.parametrize(
    ("content", "expected"), [(b"", "empty file (0 bytes)"), (b"id\tx\n", "not a parquet file")]
)
def test_empty_or_foreign_parquet(tmp_path, content, expected):
    path = tmp_path / "x.parquet"
    path.write_bytes(content)
    assert _error(validate.read_parquet, path) == f"{path.as_posix()}: {expected}"


def test_a_file_outside_results_gets_no_rebuild_hint(tmp_path, frame):
    path = _parquet(tmp_path, frame, "elsewhere/x.parquet")
    message = _error(validate.read_parquet, path, ["answer"])
    assert "rebuild" not in message and message.startswith(f"{path.as_posix()}: missing column answer")


def _npy(tmp_path, shape=(5, 3, 4), dtype=np.float16, rel=NPY) -> Path:
    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, np.arange(np.prod(shape)).reshape(shape).astype(dtype))
    return path


def test_truncated_npy_names_shape_dtype_and_rule(tmp_path):
    path = _npy(tmp_path)
    os.truncate(path, path.stat().st_size - 10)
    message = _error(validate.load_npy, path, (5, None, None), "float16")
    assert message == (
        f"{path.as_posix()}: truncated: {path.stat().st_size} of {path.stat().st_size + 10} bytes"
        f" (expected [5, 3, 4] float16) — written by rule extract_pathways;"
        f" rebuild it with: snakemake --forcerun {path.as_posix()}"
    )


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (
            {"shape": (6, None, None), "dtype": "float16"},
            "shape [5, 3, 4] float16, expected [6, 3, 4] float16",
        ),
        ({"shape": (5, 3, 4), "dtype": "float32"}, "dtype float16, expected float32"),
        ({"ndim": 4}, "has 3 dimensions [5, 3, 4], expected 4"),
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
    assert "not a .npy array (" in _error(validate.load_npy, path)


def test_good_files_are_read(tmp_path, frame):
    assert validate.read_parquet(_parquet(tmp_path, frame), ["id", "correct"]).equals(frame)
    arr = validate.load_npy(_npy(tmp_path), (5, None, None), "float16", ndim=3)
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
    assert "truncated: the last line has no line end — written by rule label_answers" in _error(
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
    assert "rule generate_answers" in message


@pytest.mark.parametrize(
    ("path", "rule"),
    [
        ("results/r/data/nq.parquet", "download_dataset"),
        ("results/r/data/depthqa_nodes.parquet", "download_depthqa"),
        ("results/r/pathways/m/nq/resid_control.npy", "extract_pathways"),
        ("results/r/pathways/m/nq/deltap.parquet", "probe_deltap"),
        ("results/r/pathways/m/nq/exp_pr.npy", "extract_experiments"),
        ("results/r/pathways/m/nq/exp_scores.parquet", "extract_experiments"),
        ("results/r/pathways/m/nq/exp_detection.parquet", "pathway_experiments"),
        ("results/r/tables/pathways_table3.tsv", "experiment_tables"),
        ("results/r/depth/m/scores.parquet", "judge_answers"),
        ("results/r/tables/depth_pooled_by_depth.tsv", "depth_tables"),
        ("results/r/tables/probe_auc.tsv", "pathways_tables"),
        ("results/r/benchmarks/score_mink/m.tsv", "score_mink"),
        ("workflow/report/published.tsv", None),
    ],
)
def test_producer_rule_from_the_layout(path, rule):
    assert validate.producer_rule(path) == rule


# ------------------------------------------------------------------------------- partial files (#13)
def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_partials_are_removed_live_ones_kept(tmp_path):
    out = tmp_path / "a.parquet"
    stale = runlog.partial_path(out, _dead_pid())
    stale.write_text("left by a SIGKILL")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.2)
        live = runlog.partial_path(out, sleeper.pid)
        live.write_text("being written")
        other = tmp_path / ".a.parquet.x.partial-1"  # another file's partial
        other.write_text("x")
        with runlog.atomic(out) as tmp:
            assert not stale.exists() and live.exists() and other.exists()
            tmp.write_text("done")
        assert out.read_text() == "done"
        # a live pid that started after the file was written is not its writer (a reused pid)
        os.utime(live, (time.time() - 3600, time.time() - 3600))
        assert runlog.remove_stale_partials(out) == [live]
    finally:
        sleeper.kill()


def test_job_start_removes_partials_of_all_its_outputs(tmp_path, capsys):
    outs = [tmp_path / "x.npy", tmp_path / "sub" / "y.parquet"]
    outs[1].parent.mkdir()
    stale = [runlog.partial_path(o, _dead_pid()) for o in outs]
    for s in stale:
        s.write_text("partial")
    sm = SimpleNamespace(log=[], rule="extract_pathways", output=[str(o) for o in outs])
    runlog.run(sm, lambda sm: None)
    assert not any(s.exists() for s in stale)
    err = capsys.readouterr().err
    assert f"removed {stale[0]}: a partial file left by a killed run of this job" in err


# ------------------------------------------------------------------- jobs die with snakemake (#14)
JOB = textwrap.dedent(
    """
    import sys, time
    from types import SimpleNamespace
    from truthflow import runlog

    def main(sm):
        with runlog.atomic(sm.output[0]) as tmp:
            tmp.write_text("partial")
            print("writing", flush=True)
            time.sleep(120)

    runlog.run(SimpleNamespace(log=[sys.argv[2]], rule="slow_rule", output=[sys.argv[1]]), main)
    """
)


def _job_cmd(tmp_path) -> list[str]:
    (tmp_path / "job.py").write_text(JOB)
    return [sys.executable, str(tmp_path / "job.py"), str(tmp_path / "out.npy"), str(tmp_path / "job.log")]


def _gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if runlog.start_time(pid) is None:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_a_job_and_removes_its_partial_file(tmp_path, sig):
    job = subprocess.Popen(_job_cmd(tmp_path), stdout=subprocess.PIPE, text=True)
    assert job.stdout.readline() == "writing\n"
    assert list(tmp_path.glob(".out.npy.partial-*"))
    job.send_signal(sig)
    assert job.wait(timeout=10) == 128 + sig
    assert not list(tmp_path.glob(".out.npy*")) and not (tmp_path / "out.npy").exists()
    log = (tmp_path / "job.log").read_text()
    assert f"truthflow: rule slow_rule stopped by {sig.name}; its partial files removed" in log
    assert "Traceback" not in log


LAUNCHER = textwrap.dedent(
    """
    import subprocess, sys
    job = subprocess.Popen(sys.argv[2:], shell=sys.argv[1] == "shell", stdout=subprocess.PIPE, text=True)
    print(job.stdout.readline(), end="", flush=True)
    job.wait()
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal and /proc: Linux")
@pytest.mark.parametrize("between", ["nothing", "shell"])
def test_a_job_dies_with_the_snakemake_that_started_it(tmp_path, between):
    """SIGKILL of the parent (named snakemake, like the real one): the job gets SIGTERM through the
    parent-death signal, or, with a shell in between (conda activation), from its watch on snakemake."""
    launcher = tmp_path / "snakemake"
    launcher.write_text(LAUNCHER)
    cmd = _job_cmd(tmp_path)
    args = ["shell", " ".join(cmd) + "; echo shell-after"] if between == "shell" else ["direct", *cmd]
    parent = subprocess.Popen([sys.executable, str(launcher), *args], stdout=subprocess.PIPE, text=True)
    assert parent.stdout.readline() == "writing\n"
    [job] = [p for p in runlog._descendants(parent.pid) if "job.py" in " ".join(runlog._argv(p)[:2])]
    parent.kill()
    parent.wait()
    assert _gone(job), "the job outlived the snakemake that started it"
    assert not list(tmp_path.glob(".out.npy*"))
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
    arr = np.load(path)
    np.save(path, arr[:-1])


def _drop_column(path: Path) -> None:
    pl.read_parquet(path).drop("answer").write_parquet(path)


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 3 : len(data) // 3 + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))


def _cut_tsv(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-3])


PW = "results/demo/pathways/smollm2-135m/nq"
CASES = {
    # file broken, how, the rule that reads it, the message after "<path>: "
    "npy truncated": (f"{PW}/resid_ko.npy", _cut, "probe_deltap", "truncated: "),
    "npy one row short": (f"{PW}/resid_clean.npy", _drop_rows, "probe_deltap", "shape ["),
    "parquet cut in half": (
        "results/demo/labels/smollm2-135m/nq.parquet",
        _cut,
        "extract_pathways",
        "truncated",
    ),
    "parquet corrupted": (f"{PW}/samples.parquet", _corrupt, "probe_deltap", "unreadable parquet"),
    "parquet column gone": (
        "results/demo/answers/smollm2-135m/nq.parquet",
        _drop_column,
        "label_answers",
        "missing",
    ),
    "tsv cut": ("results/demo/labels/smollm2-135m/nq.accuracy.tsv", _cut_tsv, "accuracy_table", "truncated"),
}


@pytest.mark.workflow
@pytest.mark.model
@pytest.mark.parametrize("case", list(CASES))
def test_broken_intermediate_fails_the_next_stage_with_one_line(demo_run, tmp_path, case):
    rel, damage, reader, what = CASES[case]
    workdir = copy_run(demo_run, tmp_path)
    damage(workdir / rel)
    proc = snakemake(workdir)
    message = _one_line_failure(proc, reader)
    producer = validate.producer_rule(rel)
    assert message.startswith(f"{rel}: {what}"), message
    assert message.endswith(f" — written by rule {producer}; rebuild it with: snakemake --forcerun {rel}"), (
        message
    )


@pytest.mark.workflow
@pytest.mark.model
def test_following_the_rebuild_line_restores_the_tables(demo_run, tmp_path):
    rel = "results/demo/depth/smollm2-135m/mink.parquet"
    workdir = copy_run(demo_run, tmp_path)
    _cut(workdir / rel)
    message = _one_line_failure(snakemake(workdir), "depth_tables")
    command = message.split("rebuild it with: ")[1].split()
    assert command[:2] == ["snakemake", "--forcerun"]
    done = snakemake(workdir, *command[1:])
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("depth_per_question.parquet", "depth_depthwise.parquet", "depth_score_gaps.parquet"):
        ours, ref = (pl.read_parquet(w / RUN / "tables" / name) for w in (workdir, demo_run))
        assert ours.equals(ref), name
    assert (workdir / RUN / "tables/depth_pooled_by_depth.tsv").read_bytes() == (
        demo_run / RUN / "tables/depth_pooled_by_depth.tsv"
    ).read_bytes()


@pytest.mark.workflow
@pytest.mark.model
def test_producer_table_matches_the_rules_snakemake_recorded(demo_run):
    """validate.producer_rule agrees with the rule Snakemake's metadata names for every table and array."""
    checked = 0
    for record in (demo_run / ".snakemake" / "metadata").rglob("*"):
        if not record.is_file():
            continue
        name = "".join(p for p in record.relative_to(demo_run / ".snakemake" / "metadata").parts)
        path = base64.urlsafe_b64decode(name + "=" * (-len(name) % 4)).decode()
        if not path.startswith("results/") or not path.endswith((".parquet", ".npy", ".tsv")):
            continue  # figures, HTML tables, logs: no stage reads them
        assert validate.producer_rule(path) == json.loads(record.read_text())["rule"], path
        checked += 1
    assert checked > 30
