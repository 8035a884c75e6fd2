"""What each job asks its scheduler for follows from the bill (truthflow.job_requests): runtime is the
estimate times the margin, memory the plan's, both grow on retry, and a job past the cluster's limit is
refused before the first job."""

import copy
import math
from pathlib import Path

import pytest
import yaml

from truthflow import job_requests, pricing
from truthflow.errors import TruthflowError
from truthflow.preflight import prepare_config

REPO = Path(__file__).resolve().parents[1]
MIB = 2**20


@pytest.fixture(scope="module")
def depth():
    config = yaml.safe_load((REPO / "configs" / "paper-depth.yaml").read_text())
    return prepare_config(config, environ={"OPENAI_API_KEY": "x"})


@pytest.fixture(scope="module")
def paper_asks():
    """Every job's request on both paper configs, from the bill's own seconds."""
    out = {}
    for path in pricing.PAPER_CONFIGS:
        config = pricing.prepared(path)
        out[path.stem] = (config, job_requests.asks(config, pricing.job_seconds(config)))
    return out


KEY = ("answer_depthqa", "llama-3-70b-instruct", "depthqa")


def test_a_70b_answers_job_by_hand(depth):
    """913 min estimated: 913 x 1.5 = 1,369.5 -> 1,370 min; attempt 2: 2,740, capped at the 24 h limit
    (1,440). Memory on the engine: torch and CUDA's 2.5 GiB and one 5 GB weight shard = 2,560 + 4,768.4 MiB,
    and a batch of state pages, 16 rows x 80 layers x 2 pages of 64 KiB (8,192 bf16 values, one page more
    mid-page) = 160 MiB -> 7,489 MiB; attempt 2: x 1.5 -> 11,234 MiB. By vLLM (the paper config's backend):
    its 4 processes at 2.5 GiB and a 5 GB shard per GPU, 10,240 + 9,536.7 -> 19,777 MiB; attempt 2 29,666."""
    asks = job_requests.asks(depth, {KEY: 913 * 60})
    ask = asks[KEY]
    limit = job_requests.limit_minutes(depth)
    assert limit == 1_440
    assert (ask.runtime_min, ask.runtime(1, limit), ask.runtime(2, limit)) == (1_370, 1_370, 1_440)
    assert ask.mem_mb == math.ceil(4 * 2_560 + 2 * 5e9 / MIB) == 19_777
    assert ask.memory(2) == 29_666
    on_engine = copy.deepcopy(depth)
    on_engine["models"][KEY[1]]["backend"] = "engine"
    ask = job_requests.asks(on_engine, {KEY: 913 * 60})[KEY]
    assert ask.mem_mb == math.ceil(2_560 + 5e9 / MIB) + 160 == 7_489
    assert ask.memory(2) == 11_234
    # a job the bill prices at 0 s asks for the floor, and still doubles on retry
    small = asks[("score_mink", "llama-3-70b-instruct", "depthqa")]
    assert (small.runtime(1, limit), small.runtime(2, limit)) == (10, 20)


def test_a_job_past_the_limit_is_refused_in_one_line(depth):
    """1,000 min estimated x 1.5 = 1,500 min > 1,440: refused, naming the job, its figures and the setting;
    a 26 h limit lets it through."""
    asks = job_requests.asks(depth, {KEY: 1_000 * 60})
    reason = job_requests.too_long(depth, asks)
    assert reason.startswith("job answer_depthqa of llama-3-70b-instruct on depthqa is estimated at 16.7 h")
    assert "25.0 h with the margin 1.5" in reason and "cluster.max_runtime_h" in reason
    assert "\n" not in reason
    with pytest.raises(TruthflowError):
        job_requests.check_runtimes(depth, asks)
    longer = {**depth, "cluster": {**depth["cluster"], "max_runtime_h": 26}}
    assert job_requests.too_long(longer, job_requests.asks(longer, {KEY: 1_000 * 60})) is None


def test_the_paper_configs_requests_follow_from_their_bills(paper_asks):
    """Goals of issue 47: no estimate above 70% of its runtime request, every request grows on retry, no
    analysis job's memory below its plan (sizing.requests), no job refused at the 24 h default."""
    from truthflow import sizing

    for name, (config, asks) in paper_asks.items():
        limit = job_requests.limit_minutes(config)
        assert job_requests.too_long(config, asks) is None, name
        for key, ask in asks.items():
            assert ask.estimate_s / 60 <= 0.7 * ask.runtime(1, limit), (name, key)
            assert ask.runtime(2, limit) > ask.runtime(1, limit), (name, key)
            assert ask.memory(2) > ask.memory(1), (name, key)
            rule, model, dataset = key
            if rule in pricing.CPU_STAGES:
                assert ask.mem_mb >= sizing.requests(config, model, dataset)[rule].mem_mb, key
    # the 70B answers jobs the engine's figures once priced at 913 and 729 min: by vLLM, their request is
    # vLLM's estimate (the bill's GPU-seconds over the 2 GPUs, the weights' load with them) x 1.5
    config, asks = paper_asks["paper-depth"]
    seconds = pricing.durations(pricing.price(config, pricing.Setting.load()))
    for key in (KEY, ("answer_depthqa", "llama-2-70b-chat", "depthqa")):
        assert asks[key].estimate_s == pytest.approx(seconds[key]), key
        assert seconds[key] < 3_600, key  # the weights' load included
        assert asks[key].runtime_min == job_requests.runtime_minutes(seconds[key], 1.5), key


def test_the_bills_ram_column_is_the_request(paper_asks):
    """The bill's RAM figure of a model job is the mem_mb its rule asks for."""
    config, asks = paper_asks["paper-depth"]
    costs = pricing.price(config, pricing.Setting.load())
    answers = next(c for c in costs if (c.rule, c.model) == KEY[:2])
    assert answers.ram_gib.value == pytest.approx(asks[KEY].mem_mb / 1024)


@pytest.mark.workflow
def test_every_rule_of_the_workflow_is_priced():
    """The rules Snakemake lists are the ones job_requests.PRICED_BY says how the bill prices: a rule added to
    the workflow and not to the bill fails here."""
    import subprocess
    import sys

    listed = subprocess.run(
        [sys.executable, "-m", "snakemake", "--list-rules"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    rules = set(listed.stdout.split())
    assert rules == set(job_requests.PRICED_BY), rules ^ set(job_requests.PRICED_BY)
    # and the jobs the disk plan and the requests walk are the rules' own runs (diskplan.qa_runs, pw_runs)
    from truthflow import diskplan

    config = pricing.prepared(pricing.PAPER_CONFIGS[0])
    walked = {job.key[0] for job in diskplan.jobs(config, {})}
    assert walked <= rules


def test_a_hand_set_request_is_refused_with_the_reason():
    """models.<name>.mem_mb and runtime were set by hand once: an old config gets one line saying why not."""
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["models"]["smollm2-135m"]["runtime"] = 720
    with pytest.raises(TruthflowError) as refused:
        prepare_config(config, [], {})
    message = str(refused.value)
    assert message.startswith("models.smollm2-135m: Additional properties are not allowed ('runtime'")
    assert "follow from the bill (cluster.max_runtime_h" in message and "\n" not in message


def _resources(out: str, rule: str, model: str) -> dict[str, str]:
    """The resources line Snakemake's dry run (-p) prints for one job."""
    for block in out.split("\nrule ")[1:]:
        if block.startswith(f"{rule}:") and f"wildcards: model={model}" in block:
            line = next(x for x in block.splitlines() if x.strip().startswith("resources:"))
            return dict(item.split("=", 1) for item in line.split(":", 1)[1].strip().split(", "))
    raise AssertionError(f"no {rule} job of {model} in the dry run")


@pytest.mark.workflow
def test_the_rules_ask_slurm_for_the_bills_figures(tmp_path):
    """configs/paper-depth.yaml through profiles/slurm: Llama-3-70B-Instruct's answers job, by vLLM, asks for
    its bill's estimate x 1.5 and 19,777 MiB on attempt 1, twice that runtime and 29,666 MiB on attempt 2."""
    import shutil

    from conftest import snakemake

    shutil.copy(REPO / "configs" / "paper-depth.yaml", tmp_path / "config.yaml")
    config = pricing.prepared(REPO / "configs" / "paper-depth.yaml")
    estimate = pricing.job_seconds(config)[KEY]
    asked = {}
    for attempt in (1, 2):
        profile = str(REPO / "profiles" / "slurm")
        fake = {"OPENAI_API_KEY": "sk-test", "CUDA_VISIBLE_DEVICES": ""}
        proc = snakemake(
            tmp_path, "-n", "-p", "--profile", profile, "--attempt", str(attempt), extra_env=fake
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        asked[attempt] = _resources(proc.stdout, "answer_depthqa", "llama-3-70b-instruct")
    assert int(asked[1]["runtime"]) == math.ceil(estimate * 1.5 / 60) and int(asked[1]["mem_mb"]) == 19_777
    assert int(asked[2]["runtime"]) == 2 * int(asked[1]["runtime"]) and int(asked[2]["mem_mb"]) == 29_666
    assert asked[1]["gpu"] == asked[2]["gpu"] == "2"


def test_an_openai_judge_job_asks_for_its_calls(depth):
    """paper-depth's gpt-4 judge: 1,571 questions x 1 judgment x 8 s a call over 4 in flight = 3,142 s,
    x 1.5 = 78.6 -> 79 min per judged model (the profile's 60 min default once, and its calls are cached)."""
    asks = job_requests.asks(depth, {})
    judged = {key: ask for key, ask in asks.items() if key[0] == "judge_answers"}
    assert len(judged) == 7
    assert {(a.estimate_s, a.runtime_min, a.mem_mb) for a in judged.values()} == {(3_142.0, 79, 2_000)}
