"""benchmarks/gpu_check.py on the tiny shape (CPU, any machine): every check runs and passes, its reference
runs in two subprocesses, and a failed check makes the table say FAIL and the script exit 1."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO

BENCH = REPO / "benchmarks"
CHECKS = (
    r"kernels: P\(True\), clean padded pass \| \d+ SDPA calls ran flash \(probe: flash\) \| pass",
    r"kernels: knockout, 4D masks \| \d+ SDPA calls ran flash \(probe: flash\) \| pass",
    r"kernels: generation, prefill \+ decode \| \d+ SDPA calls ran flash \(probe: flash\) \| pass",
    r"kernels: saliency, eager \| 0 SDPA calls .* \| pass",
    r"host syncs per decode step \| no device to wait for \(CPU\) \| skip",
    r"decode cost per step \| [\d.]+ ms/step over the first 4 tokens, [\d.]+ ms over 5-16 .* \| figure",
    r"sampled answers across batch sizes \| 16/16 prompts the same at batch 1, 8 and 16 .* \| pass",
    *(
        rf"{what} vs plain, {first} first \| project first [\d.]+ s, repeat [\d.]+ s; plain first"
        for what in ("forward", "generate")
        for first in ("project", "plain")
    ),
)


def test_gpu_check_passes_on_the_tiny_shape():
    proc = subprocess.run(
        [sys.executable, str(BENCH / "gpu_check.py"), "--shape", "tiny"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    table = proc.stdout
    assert table.startswith("| shape | check | result | verdict |") and "all checks passed" in table
    for check in CHECKS:
        assert re.search(check, table), (check, table)


@pytest.fixture
def gpu_check(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("gpu_check")


def test_cudnn_attention_fails_every_kernel_check(gpu_check, monkeypatch):
    """A cuDNN attention kernel in a path's profile fails that path's check (saliency's too)."""
    from truthflow.engine import backend

    lm = gpu_check.random_model("tiny", dtype="float32", device="cpu")
    monkeypatch.setattr(backend, "cudnn_attention", lambda prof: ["cudnn_generated_fort_native_sdpa_kernel"])
    table = gpu_check.Table()
    gpu_check.kernel_checks(lm, "tiny", table, 4)
    kernel_rows = [row for row in table.rows if row[1].startswith("kernels: ")]
    assert len(kernel_rows) == 4 and all(verdict == "FAIL" for *_, verdict in kernel_rows)
    assert all("cuDNN: cudnn_generated" in result for _, _, result, _ in kernel_rows)


def test_answers_that_depend_on_the_batch_fail_the_sampled_check(gpu_check, monkeypatch):
    """Prompt 3's third new token changes with the batch size: the row fails and names it."""
    lm = gpu_check.random_model("tiny", dtype="float32", device="cpu")

    def generate(lm, prompts, batch, tokens, **kwargs):
        return [{"answer_ids": [7, 8, batch if i == 3 else 9]} for i in range(len(prompts))]

    monkeypatch.setattr(gpu_check, "generate_answers", generate)
    table = gpu_check.Table()
    gpu_check.sampled_check(lm, "tiny", table, gpu_check.Sizes(tiny=True))
    [(_, check, result, verdict)] = table.rows
    assert verdict == "FAIL" and result.startswith("15/16 prompts the same")
    assert result.endswith("differing prompts (first differing new token): 3 (2)")


def test_first_difference_by_hand(gpu_check):
    assert gpu_check.first_difference([[5, 6, 7], [5, 6, 8], [5, 6, 7]]) == 2
    assert gpu_check.first_difference([[5, 6], [5, 6, 7]]) == 2
    assert gpu_check.first_difference([[4], [5]]) == 0


def test_a_failed_check_exits_1_after_the_table(gpu_check, monkeypatch, capsys):
    def one_failure(shape, table):
        table.check(shape, "sampled answers across batch sizes", "15/16 prompts the same", False)

    monkeypatch.setattr(gpu_check, "check_shape", one_failure)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--shape", "tiny"])
    assert gpu_check.main() == 1
    out = capsys.readouterr().out
    assert "| tiny | sampled answers across batch sizes | 15/16 prompts the same | FAIL |" in out
    assert out.rstrip().endswith("1 check(s) failed")
