"""Long-run robustness on real models: OOM back-off gives identical results, and a job killed with SIGKILL
leaves nothing Snakemake would take for a finished output."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import numpy as np
import polars as pl
import pytest
from conftest import new_workdir, small_config, snakemake, snakemake_cmd

from truthflow.batching import FAKE_OOM_ENV
from truthflow.generation import build_prompt, generate_answers
from truthflow.knockout import resid_sweep

pytestmark = pytest.mark.slow
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
    clean_ref, ko_ref = resid_sweep(gemma, seqs, probe, blocks, batch_size=2, out_dtype=np.float32)
    monkeypatch.setenv(FAKE_OOM_ENV, "2")
    clean, ko = resid_sweep(gemma, seqs, probe, blocks, batch_size=8, out_dtype=np.float32)
    assert np.array_equal(clean, clean_ref) and np.array_equal(ko, ko_ref)


def test_oom_at_batch_one_is_raised(gemma, monkeypatch):
    monkeypatch.setenv(FAKE_OOM_ENV, "0")
    with pytest.raises(Exception, match="out of memory"):
        generate_answers(
            gemma, ["Q: hi\nA:"], batch_size=4, max_new_tokens=2, stop_at_newline=True, chat=False
        )


def _start_and_wait_for_generation(workdir, target, log):
    cmd = snakemake_cmd(workdir, target)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 600
    while time.time() < deadline:  # wait until the job is generating, batches already written
        if log.exists() and "8/100" in log.read_text():
            return proc
        if proc.poll() is not None:
            pytest.fail("the job ended before it could be killed")
        time.sleep(0.3)
    pytest.fail("the job never started generating")


def _job_pids(session: int) -> list[int]:
    out = subprocess.run(
        ["pgrep", "-s", str(session), "-f", "generate_answers.py"], capture_output=True, text=True
    )
    return [int(p) for p in out.stdout.split()]


@pytest.mark.parametrize("victim", ["job", "snakemake and job"])
def test_sigkill_mid_job_then_rerun_completes(tmp_path, demo_models_root, victim):
    cfg = small_config()
    cfg["datasets"]["nq"]["n"] = 100
    cfg["models"]["gemma3-270m"]["batch_size"] = 4  # many batches: time to kill it in the middle
    workdir = new_workdir(tmp_path, demo_models_root, cfg)
    target = "results/demo/answers/gemma3-270m/nq.parquet"
    log = workdir / "results/demo/logs/generate_answers/gemma3-270m/nq.log"
    proc = _start_and_wait_for_generation(workdir, target, log)
    if victim == "job":  # the job alone dies (OOM killer, scheduler): snakemake sees the failure
        pids = _job_pids(proc.pid)
        assert pids
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=120) != 0
    else:  # everything dies at once: snakemake's lock stays, --unlock clears it
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert snakemake(workdir, "--unlock").returncode == 0
    assert not (workdir / target).exists()
    assert not list((workdir / "results/demo/answers/gemma3-270m").glob("nq.parquet*"))
    dry = snakemake(workdir, "-n", target)
    assert "generate_answers" in dry.stdout + dry.stderr  # the rerun plans the job again
    done = snakemake(workdir, target)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = pl.read_parquet(workdir / target)
    assert answers.height == 100 and answers["answer"].null_count() == 0
    again = snakemake(workdir, "-n", target)
    assert "Nothing to be done" in again.stdout + again.stderr
