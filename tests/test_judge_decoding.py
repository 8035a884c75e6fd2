"""The judge's decoding as a setting (truthflow.depth.judge): sampled verdicts, several per answer with
their mean and spread, each cached under its seed and index, so a rerun pays nothing and a fresh cache draws
the same verdicts; the config checker refuses the combinations that cannot work, naming the key."""

from __future__ import annotations

import math
import statistics

import polars as pl
import pytest
import yaml
from conftest import copy_run, small_config, snakemake, write_config
from test_judge import ROW, endpoint, judge_cfg, key, openai_cfg  # noqa: F401 - fixtures

from truthflow.config import check_schema
from truthflow.depth import judge
from truthflow.depth.judge import f1_to_score, judge_all, sampled_f1_score, token_f1
from truthflow.errors import TruthflowError

ROWS = [
    ROW,
    {
        "qid": "d1_q2",
        "question": "Q2?",
        "answer": "the sun is a star of light",
        "reference": "the sun is a star",
    },
    {
        "qid": "d2_q1",
        "question": "Q3?",
        "answer": "water boils at one hundred",
        "reference": "at 100 degrees",
    },
]
SAMPLED = {"backend": "reference", "judgments": 5, "decoding": {"mode": "sampled", "seed": 7}}


def test_sampled_reference_score_by_hand() -> None:
    # F1 0.6: 4·F1 = 2.4; at T = 1, 1 + floor(2.4 + 0.5 + (u - 0.5)) = 1 + floor(2.4 + u)
    assert sampled_f1_score(0.6, 1.0, 0.5) == 3 and sampled_f1_score(0.6, 1.0, 0.7) == 4
    assert sampled_f1_score(0.6, 1.0, 0.0) == 3 and sampled_f1_score(0.6, 1.0, 0.65) == 4
    # T = 0.5: 1 + floor(2.9 + 0.5·(u - 0.5)); u = 0.9 -> floor(3.1) = 3 -> 4; u = 0.5 -> floor(2.9) -> 3
    assert sampled_f1_score(0.6, 0.5, 0.9) == 4 and sampled_f1_score(0.6, 0.5, 0.5) == 3
    assert sampled_f1_score(1.0, 2.0, 0.99) == 5 and sampled_f1_score(0.0, 2.0, 0.0) == 1  # clipped to 1-5
    for f1 in (0.0, 0.3, 0.6, 1.0):  # T -> 0 is the greedy mapping (away from a half, where it rounds up)
        assert sampled_f1_score(f1, 1e-9, 0.3) == sampled_f1_score(f1, 1e-9, 0.7) == f1_to_score(f1)
    assert sampled_f1_score(0.625, 1.0, 0.5) == f1_to_score(0.625) == 4  # u = 1/2: no offset at any T


def test_draw_seed_depends_on_seed_key_and_index_only() -> None:
    seeds = {judge.draw_seed(s, k, i) for s in (0, 1) for k in ("a", "b") for i in (0, 1)}
    assert len(seeds) == 8 and all(0 <= s < 2**31 for s in seeds)
    assert judge.draw_seed(3, "k", 2) == judge.draw_seed(3, "k", 2)


def test_several_sampled_verdicts_give_mean_and_spread(tmp_path) -> None:
    table = judge_all(ROWS, judge_cfg(SAMPLED), tmp_path / "c.jsonl", progress=False)
    assert table["n_judgments"].to_list() == [5, 5, 5] and table["n_unparseable"].to_list() == [0, 0, 0]
    for row in table.iter_rows(named=True):
        verdicts = row["judgments"]
        assert row["score"] == pytest.approx(statistics.mean(verdicts))
        assert row["score_sd"] == pytest.approx(statistics.stdev(verdicts))
    # token-F1 2/3 (ROW): 4·F1 = 2.67, so every draw is 3 or 4 (score - 1 = floor(2.67 + u))
    assert set(table["judgments"].to_list()[0]) <= {3, 4}
    f1 = token_f1(ROWS[1]["answer"], ROWS[1]["reference"])
    assert set(table["judgments"].to_list()[1]) <= {1 + math.floor(4 * f1), 2 + math.floor(4 * f1)}
    # the draws are not all alike: a spread where 4·F1 is not an integer
    assert any(len(set(v)) > 1 for v in table["judgments"].to_list())


def test_sampled_rerun_pays_nothing_and_a_fresh_cache_draws_the_same(tmp_path) -> None:
    cache = tmp_path / "c.jsonl"
    first = judge_all(ROWS, judge_cfg(SAMPLED), cache, progress=False)
    assert len(cache.read_text().splitlines()) == 15  # 3 answers x 5 verdicts, each under its own key
    again = judge_all(ROWS, judge_cfg(SAMPLED), cache, progress=False)
    assert again["cached"].all() and again.drop("cached").equals(first.drop("cached"))
    # another order, a subset, a fresh cache: every answer's verdicts are the same draws
    alone = judge_all(ROWS[::-1], judge_cfg(SAMPLED), tmp_path / "other.jsonl", progress=False)
    assert alone.sort("qid").drop("cached").equals(first.sort("qid").drop("cached"))
    one = judge_all(ROWS[1:2], judge_cfg(SAMPLED), tmp_path / "one.jsonl", progress=False)
    assert one["judgments"].to_list() == first["judgments"].to_list()[1:2]
    # another seed draws again
    other = judge_all(
        ROWS, judge_cfg({**SAMPLED, "decoding": {"mode": "sampled", "seed": 8}}), cache, progress=False
    )
    assert not other["cached"].any() and other["judgments"].to_list() != first["judgments"].to_list()
    # more verdicts keep the first five and draw only the new ones
    more = judge_all(ROWS, judge_cfg({**SAMPLED, "judgments": 7}), cache, progress=False)
    assert [v[:5] for v in more["judgments"].to_list()] == first["judgments"].to_list()


def test_greedy_default_is_todays_single_verdict(tmp_path) -> None:
    table = judge_all(ROWS, judge_cfg({"backend": "reference"}), tmp_path / "c.jsonl", progress=False)
    expected = [f1_to_score(token_f1(r["answer"], r["reference"])) for r in ROWS]
    assert table["judgments"].to_list() == [[s] for s in expected] and table["score"].to_list() == expected


def test_openai_sampled_sends_its_settings_and_a_seed_per_verdict(endpoint, key, tmp_path) -> None:  # noqa: F811
    endpoint.replies = [(200, "Feedback: fine. [RESULT] 4"), (200, "no verdict"), (200, "ok [RESULT] 2")]
    cfg = openai_cfg(endpoint.base_url, judgments=3, max_new_tokens=1024)
    cfg["decoding"] = {"mode": "sampled", "temperature": 1.0, "top_p": 0.9, "seed": 42}
    table = judge_all([ROW], cfg, tmp_path / "c.jsonl", progress=False)
    bodies = [r["body"] for r in endpoint.requests]
    assert len(bodies) == 3
    assert {(b["temperature"], b["top_p"], b["max_tokens"]) for b in bodies} == {(1.0, 0.9, 1024)}
    assert len({b["seed"] for b in bodies}) == 3
    # the replies come back in any order (4 requests in flight); one did not parse: a cached draw, left out
    row = table.row(0, named=True)
    assert sorted(v for v in row["judgments"] if v is not None) == [2, 4] and row["n_unparseable"] == 1
    assert row["score"] == 3.0 and row["score_sd"] == pytest.approx(math.sqrt(2))
    again = judge_all([ROW], cfg, tmp_path / "c.jsonl", progress=False)
    assert len(endpoint.requests) == 3 and again["cached"].all()
    assert again["judgments"].to_list() == table["judgments"].to_list()
    greedy = judge_all([ROW], openai_cfg(endpoint.base_url), tmp_path / "g.jsonl", progress=False)
    body = endpoint.requests[-1]["body"]
    assert body["temperature"] == 0 and "seed" not in body and "top_p" not in body
    assert greedy["n_judgments"].to_list() == [1]


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        (
            {"backend": "reference", "judgments": 3},
            r"^config key 'depth\.judge\.judgments' is 3, but .* greedy",
        ),
        (
            {"backend": "hf", "model": "x", "decoding": {"mode": "sampled"}},
            r"^config key 'depth\.judge\.decoding\.mode': the hf judge decodes greedily only",
        ),
        (
            {"backend": "reference", "prompt": "missing.yaml"},
            r"^config key 'depth\.judge\.prompt': prompt file",
        ),
    ],
)
def test_check_judge_config_refuses_what_cannot_run(cfg, match) -> None:
    with pytest.raises(TruthflowError, match=match):
        judge.check_judge_config(judge_cfg(cfg), {})


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        (("judge", "decoding", "mode"), "beam", r"^depth\.judge\.decoding\.mode: 'beam' is not one of"),
        (
            ("judge", "decoding", "temperature"),
            0,
            r"^depth\.judge\.decoding\.temperature: 0 is less than or equal",
        ),
        (("judge", "decoding", "top_p"), 1.5, r"^depth\.judge\.decoding\.top_p: 1\.5 is greater than"),
        (("judge", "decoding", "seed"), -1, r"^depth\.judge\.decoding\.seed: -1 is less than"),
        (("judge", "decoding", "tempreature"), 1, r"^depth\.judge\.decoding: Additional properties"),
        (("judge", "judgments"), 0, r"^depth\.judge\.judgments: 0 is less than"),
        (("judge", "prompt"), "", r"^depth\.judge\.prompt: '' should be non-empty"),
        (
            ("metrics", "unparseable"),
            "drop",
            r"^depth\.metrics\.unparseable: 'drop' is not one of \['omit', 'zero'\]",
        ),
        (("metrics", "n_boot"), 10, r"^depth\.metrics\.n_boot: 10 is less than the minimum of 100"),
        (("prompt",), 3, r"^depth\.prompt: 3 is not of type 'string'"),
        # the answers' decoding
        (("decoding", "mode"), "beam", r"^depth\.decoding\.mode: 'beam' is not one of"),
        (("decoding", "top_p"), 0, r"^depth\.decoding\.top_p: 0 is less than or equal"),
        (
            ("decoding", "repetition_penalty"),
            -1,
            r"^depth\.decoding\.repetition_penalty: -1 is less than or equal",
        ),
        (("decoding", "seed"), "42", r"^depth\.decoding\.seed: '42' is not of type 'integer'"),
    ],
)
def test_bad_values_are_one_message_naming_the_key(path, value, match) -> None:
    cfg = small_config()
    node = cfg["depth"]
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    with pytest.raises(TruthflowError, match=match):
        check_schema(cfg)


@pytest.mark.workflow
@pytest.mark.model
def test_demo_with_sampled_answers_and_judgments_reruns_byte_for_byte(pristine_run, tmp_path) -> None:
    """The demo with answers sampled as the authors did and three sampled verdicts per answer: a forced
    rerun of the judge reads every verdict from the cache, and a rerun of the answers and the judge without
    the cache draws the same answers and verdicts, byte for byte."""
    workdir = copy_run(pristine_run, tmp_path)
    for cache in (workdir / "resources" / "judge_cache").glob("*.jsonl"):  # hard links: the pristine run's
        data = cache.read_bytes()
        cache.unlink()
        cache.write_bytes(data)
    cfg = yaml.safe_load((workdir / "config.yaml").read_text())
    cfg["depth"]["judge"] = {
        "backend": "reference",
        "judgments": 3,
        "decoding": {"mode": "sampled", "seed": 5},
    }
    sampled = {"mode": "sampled", "temperature": 1.0, "top_p": 0.9, "repetition_penalty": 1.03, "seed": 42}
    cfg["depth"].update(decoding=sampled, max_new_tokens=8)
    write_config(workdir, cfg)
    target = "results/demo/tables/depth_metrics.tsv"
    depth = workdir / "results" / "demo" / "depth"
    greedy = {p: pl.read_parquet(p)["answer"] for p in sorted(depth.glob("*/answers.parquet"))}

    def run(*args: str) -> list[bytes]:
        proc = snakemake(workdir, target, *args)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        files = sorted(depth.glob("*/answers.parquet")) + sorted(depth.glob("*/scores.parquet"))
        return [p.read_bytes() for p in files] + [(workdir / target).read_bytes()]

    first = run()
    for path, before in greedy.items():  # the settings reached the answers: sampled, 8 new tokens at most
        assert not pl.read_parquet(path)["answer"].equals(before)
    scores = sorted(depth.glob("*/scores.parquet"))
    tables = [pl.read_parquet(p) for p in scores]
    assert all(set(t["n_judgments"]) == {3} and not t["cached"].any() for t in tables)
    cached = run("--forcerun", "judge_answers")
    for before, path in zip(tables, scores, strict=True):
        after = pl.read_parquet(path)
        assert after["cached"].all() and after.drop("cached").equals(before.drop("cached"))
    assert cached[-1] == first[-1]
    for cache in (workdir / "resources" / "judge_cache").glob("*.jsonl"):
        cache.unlink()
    assert run("--forcerun", "answer_depthqa", "judge_answers") == first
