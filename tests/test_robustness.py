"""Long-run robustness on real models: OOM back-off gives identical results; a job killed with SIGKILL
leaves nothing Snakemake would take for a finished output (Snakemake removes a failed job's outputs) and the
rerun gives the same tables as an uninterrupted run; killing snakemake (SIGTERM, SIGKILL) stops its jobs."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import RUN, checkout_config, copy_run, env, knockout_sweep, snakemake, snakemake_cmd

from truthflow.engine import FAKE_OOM_ENV
from truthflow.generation import build_prompt, generate_answers
from truthflow.runlog import STOP_AT_ENV

QUESTIONS = [
    "What is the capital of France?",
    "Who wrote Hamlet?",
    "How many legs does a spider have?",
    "What colour is the sky?",
    "Who painted the Mona Lisa?",
    "What is the largest planet?",
    "What is the currency of Japan?",
    "What is H2O?",
    "Who was the first US president?",
]


@pytest.fixture(scope="module")
def gemma():
    """A random-weight Gemma-3 twin (sliding window 8, soft-cap): the back-off is model-independent."""
    from truthflow.twins import build_twin

    return build_twin("gemma3")


def test_oom_halves_batch_with_identical_results(gemma, monkeypatch):
    prompts = [build_prompt(gemma.tokenizer, q, chat=False) for q in QUESTIONS]
    reference = generate_answers(
        gemma, prompts, batch_size=2, max_new_tokens=8, stop_at_newline=True, chat=False
    )
    monkeypatch.setenv(FAKE_OOM_ENV, "2")  # every batch above 2 raises CUDA OOM at the real call site
    backed_off = generate_answers(
        gemma, prompts, batch_size=8, max_new_tokens=8, stop_at_newline=True, chat=False
    )
    assert backed_off == reference

    seqs = [p["prompt_ids"] + p["answer_ids"] for p in reference]
    probe = [len(s) - 1 for s in seqs]
    blocks = [[1, 2]] * len(seqs)
    monkeypatch.delenv(FAKE_OOM_ENV)
    clean_ref, (ko_ref,) = knockout_sweep(gemma, seqs, probe, [blocks], 2)
    monkeypatch.setenv(FAKE_OOM_ENV, "2")
    clean, (ko,) = knockout_sweep(gemma, seqs, probe, [blocks], 8)
    assert np.array_equal(clean, clean_ref) and np.array_equal(ko, ko_ref)


def test_oom_at_batch_one_is_raised(gemma, monkeypatch):
    monkeypatch.setenv(FAKE_OOM_ENV, "0")
    with pytest.raises(Exception, match="out of memory"):
        generate_answers(
            gemma, ["Q: hi\nA:"], batch_size=4, max_new_tokens=2, stop_at_newline=True, chat=False
        )


@pytest.mark.workflow
@pytest.mark.parametrize("victim", ["job", "snakemake and job"])
def test_sigkill_mid_job_then_rerun_completes(pristine_run, tmp_path, victim):
    cfg = checkout_config()
    workdir = copy_run(pristine_run, tmp_path)
    target = "results/demo/answers/smollm2-135m/nq.parquet"
    # the job stops itself (SIGSTOP) when its progress bar first shows: model loaded, generation under way
    proc = _start(
        workdir, "--forcerun", target, "--", target, extra_env={STOP_AT_ENV: "generate smollm2-135m/nq"}
    )
    job = _wait_for(
        lambda: [p for p in _session(proc.pid) if _state(p) == "T"],  # the job's own process
        proc,
        "generate_answers to start",
    )
    if victim == "job":  # the job alone dies (OOM killer, scheduler): snakemake sees the failure
        for pid in job:
            os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=120) != 0
    else:  # everything dies at once: snakemake's lock stays, --unlock clears it
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert snakemake(workdir, "--unlock").returncode == 0
    assert not (workdir / target).exists()
    assert not list((workdir / "results/demo/answers/smollm2-135m").glob("nq.parquet*"))
    dry = snakemake(workdir, "-n", target)
    assert "generate_answers" in dry.stdout + dry.stderr  # the rerun plans the job again
    done = snakemake(workdir, target)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = pl.read_parquet(workdir / target)
    assert answers.height == cfg["datasets"]["nq"]["n"] and answers["answer"].null_count() == 0
    again = snakemake(workdir, "-n", target)
    assert "Nothing to be done" in again.stdout + again.stderr


# ------------------------------------------------------------ kills in copies of the shared run


def _start(workdir: Path, *args: str, extra_env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        snakemake_cmd(workdir, *args),
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its session id is its pid: every job it starts is found by that
        env=env(**(extra_env or {})),
    )


def _session(sid: int, pattern: str | None = None) -> list[int]:
    """Live processes of a session (zombies have exited: the test has not reaped snakemake yet)."""
    cmd = ["pgrep", "-s", str(sid)] + (["-f", pattern] if pattern else [])
    pids = [int(p) for p in subprocess.run(cmd, capture_output=True, text=True).stdout.split()]
    return [p for p in pids if _state(p) not in (None, "Z")]


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _wait_for(predicate, proc: subprocess.Popen, what: str, timeout: float = 900):
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = predicate()
        if found:
            return found
        if proc.poll() is not None:
            pytest.fail(f"snakemake ended before {what}")
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


RESID = ["resid_clean.npy", "resid_ko.npy", "resid_control.npy"]
KILLED = {  # rule: (one of its outputs, the progress bar it is stopped at, its outputs in that folder)
    "extract_pathways": (
        RUN / "pathways/smollm2-135m/nq/samples.parquet",
        "knockout smollm2-135m/nq",
        ["samples.parquet", "dropped.parquet", "saliency.parquet", *RESID],  # arrays: written as computed
    ),
    "score_mink": (RUN / "depth/smollm2-135m/mink.parquet", "min-k% smollm2-135m", ["mink.parquet"]),
}


@pytest.mark.workflow
@pytest.mark.parametrize("rule", list(KILLED))
def test_sigkill_mid_job_then_rerun_gives_identical_outputs(pristine_run, tmp_path, rule):
    output, bar, outputs = KILLED[rule]
    workdir = copy_run(pristine_run, tmp_path)
    # the job stops itself (SIGSTOP) when its progress bar first shows: model loaded, outputs being computed
    job_args = ("--forcerun", str(output), "--", str(output))  # this job alone
    proc = _start(workdir, *job_args, extra_env={STOP_AT_ENV: bar})
    job = _wait_for(lambda: [p for p in _session(proc.pid) if _state(p) == "T"], proc, f"{rule} to start")
    for pid in job:
        os.kill(pid, signal.SIGKILL)
    assert proc.wait(timeout=300) != 0
    assert not any((workdir / output.parent / name).exists() for name in outputs)  # removed by Snakemake
    done = snakemake(workdir, *job_args)  # the same command again
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"rule {rule}:" in done.stdout + done.stderr
    # every output equals the uninterrupted run's bit for bit: so does every table computed from them (the
    # downstream jobs are functions of their inputs, test_cache.py)
    for name in outputs:
        ours, ref = workdir / output.parent / name, pristine_run / output.parent / name
        if name.endswith(".parquet"):
            assert pl.read_parquet(ours).equals(pl.read_parquet(ref)), name
        else:
            assert ours.read_bytes() == ref.read_bytes(), name


@pytest.mark.workflow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killing_snakemake_stops_its_jobs(pristine_run, tmp_path, sig):
    """SIGTERM: snakemake would wait for the running jobs (hours, for a model job); SIGKILL: the job would be
    orphaned and keep the cores busy. Either way no process of the run is left within 10 s; after a SIGTERM
    Snakemake has removed the job's outputs, after a SIGKILL they are marked incomplete."""
    workdir = copy_run(pristine_run, tmp_path)
    output = RUN / "pathways/smollm2-135m/nq/samples.parquet"
    arrays = [workdir / output.parent / name for name in RESID]
    started = time.time()
    proc = _start(workdir, "--forcerun", str(output))
    _wait_for(  # Snakemake removed the copied arrays before the job started: these are the job's
        lambda: all(a.exists() and a.stat().st_mtime >= started for a in arrays),
        proc,
        "extract_pathways to write its arrays",
    )
    job = _session(proc.pid, "extract_pathways.py")
    assert job
    os.kill(proc.pid, sig)
    deadline = time.time() + 10
    while time.time() < deadline and _session(proc.pid):
        time.sleep(0.2)
    assert _session(proc.pid) == [], subprocess.run(
        ["ps", "-o", "pid,stat,args", "-s", str(proc.pid)], capture_output=True, text=True
    ).stdout
    proc.wait(timeout=10)
    assert not (workdir / output).exists()
    if sig == signal.SIGTERM:
        assert not any(a.exists() for a in arrays)
    else:
        assert snakemake(workdir, "--unlock").returncode == 0
        dry = snakemake(workdir, "-n", str(output))
        assert "extract_pathways" in dry.stdout + dry.stderr
    log = (workdir / RUN / "logs/extract_pathways/smollm2-135m/nq.log").read_text()
    assert "truthflow: rule extract_pathways stopped by SIGTERM" in log
