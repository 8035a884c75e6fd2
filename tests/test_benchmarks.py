"""Every benchmark script runs on a tiny random-weight shape (no demo model, any CPU) and prints its figures,
so that none of them rots between the GPU sessions that use them at full size."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO

# script and arguments -> what its figures look like
RUNS = {
    "bench_generate.py": (
        ["--n", "8", "--max-new-tokens", "4", "--batch", "4", "--threads", "1"],
        [
            r"project cold : +\d+ new tokens in .* tokens/s",
            r"plain +: +\d+ new tokens",
            r"identical answers 8/8; the project.s two runs agree on 8/8",
        ],
    ),
    "bench_knockout.py": (
        ["--n", "8", "--batch", "4", "--naive-n", "2", "--length", "24", "--prefix", "8"],
        [
            r"clean \+ E_Q: .* samples/s",
            r"reference, two masked batched passes: .* samples/s",
            r"peak memory",
        ],
    ),
    "bench_experiments.py": (
        ["--n", "8", "--batch", "4", "--length", "12", "--prefix", "8"],
        [
            r"project, saliency \+ baseline from its pass: .* samples/s",
            r"reference, saliency \+ its own clean pass: .* samples/s",
            r"baselines differ by at most",
        ],
    ),
    "bench_depth.py": (
        ["--n", "8", "--batch", "4", "--max-new-tokens", "4"],
        [r"score_mink 8 questions in .* questions/s", r"answer_depthqa 8 answers, \d+ new tokens"],
    ),
    "gpu_smoke.py": (
        ["--dtype", "float32", "--n", "16"],
        [r"PASS probes \+ check", r"PASS saliency", r"PASS HF judge", r"all stages passed"],
    ),
}


@pytest.mark.parametrize("script", sorted(RUNS))
def test_benchmark_runs_on_a_tiny_shape(script):
    args, figures = RUNS[script]
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), "--shape", "tiny", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    for figure in figures:
        assert re.search(figure, proc.stdout), (figure, proc.stdout[-2000:])
