"""Loaders on the shipped demo sets, on the real published copies in ../shared, and on bad input."""

import json

import polars as pl
import pytest
from conftest import REPO

from truthflow.data import load_depthqa, load_qa, sample_indices
from truthflow.errors import TruthflowError

DEMO = REPO / "data" / "demo"


def local(path, **extra):
    return {"source": {"local": str(path), **extra}, "n": None, "seed": 0}


@pytest.mark.parametrize(
    "name,path",
    [
        ("popqa", "popqa/popqa.tsv"),
        ("triviaqa", "triviaqa/validation.jsonl"),
        ("hotpotqa", "hotpotqa/hotpot_dev_distractor_v1.json"),
        ("nq", "nq/NQ-open.dev.jsonl"),
    ],
)
def test_demo_sets_load(name, path):
    df, report = load_qa(name, local(DEMO / path))
    assert df.height >= 100 and report["kept"] == df.height
    assert df["id"].n_unique() == df.height
    assert set(df.columns) >= {"id", "dataset", "question", "answers"}
    assert all(len(a) >= 1 for a in df["answers"].to_list())
    if name == "popqa":
        assert {"subj", "prop", "s_pop"} <= set(df.columns)
        assert all(s in q for s, q in zip(df["subj"], df["question"], strict=True))
    if name == "hotpotqa":
        assert set(df["type"].unique()) == {"bridge", "comparison"}


def test_sampling_is_deterministic_and_sized():
    a, _ = load_qa("nq", {**local(DEMO / "nq/NQ-open.dev.jsonl"), "n": 30, "seed": 3})
    b, _ = load_qa("nq", {**local(DEMO / "nq/NQ-open.dev.jsonl"), "n": 30, "seed": 3})
    c, _ = load_qa("nq", {**local(DEMO / "nq/NQ-open.dev.jsonl"), "n": 30, "seed": 4})
    assert a.height == 30 and a.equals(b) and not a.equals(c)
    assert sample_indices(5, None, 0) == [0, 1, 2, 3, 4]


def test_demo_depthqa_graph():
    questions, nodes, report = load_depthqa(local(DEMO / "depthqa"))
    assert report["groups"] >= 8
    assert set(questions["depth"].unique()) == {1, 2, 3}
    assert nodes.filter(pl.col("depth") == 3).height == report["groups"]
    assert set(nodes["qid"]) <= set(questions["id"])
    sub_q, sub_n, rep = load_depthqa({**local(DEMO / "depthqa"), "n": 3})
    assert rep["groups"] == 3 and sub_n.filter(pl.col("depth") == 3).height == 3


def test_missing_file_and_wrong_columns(tmp_path):
    with pytest.raises(TruthflowError, match="nq.*does not exist"):
        load_qa("nq", local(tmp_path / "nope.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"query": "q", "gold": ["a"]}) + "\n")
    with pytest.raises(TruthflowError, match=r"lacks column\(s\) \['question'"):
        load_qa("nq", local(bad))
    ok, _ = load_qa("nq", local(bad, columns={"question": "query", "answer": "gold"}))
    assert ok["answers"].to_list() == [["a"]]


# ------------------------------------------------------------ the real published copies (../shared)
def test_real_nq_open(shared_real):
    df, _ = load_qa("nq", local(shared_real / "nq_open/NQ-open.dev.jsonl"))
    assert df.height == 3610
    first = df.row(0, named=True)
    assert first["answers"] and first["question"] == first["question"].lower()


def test_real_popqa_full_schema(shared_real):
    df, _ = load_qa("popqa", local(shared_real / "popqa/neuropath/popqa.json"))
    assert df.height == 1000
    assert set(df["prop"].unique()) == {"occupation", "place of birth"}
    row = df.filter(pl.col("question") == "What is George Rankin's occupation?").row(0, named=True)
    assert row["subj"] == "George Rankin" and len(row["answers"]) >= 1


def test_real_popqa_renamed_fields(shared_real):
    spec = local(
        shared_real / "popqa/model_collaboration/popqa.json",
        field="test",
        columns={"question": "input", "possible_answers": "output"},
    )
    df, _ = load_qa("popqa", spec)
    assert df.height == 1000 and df["id"].n_unique() == 1000
    assert all(isinstance(a, list) and a for a in df["answers"].to_list())


def test_real_triviaqa_llm_foundry(shared_real):
    spec = local(shared_real / "triviaqa/llm-foundry/triviaqa_sm_sub.jsonl", columns={"question": "context"})
    df, _ = load_qa("triviaqa", spec)
    assert df.height == 3000
    assert not any(q.startswith("Question:") or q.endswith("Answer:") for q in df["question"])
    assert all(len(a) >= 1 for a in df["answers"].to_list())


def test_real_triviaqa_official_layout(shared_real):
    df, _ = load_qa("triviaqa", local(shared_real / "triviaqa/official_sample/triviaqa_sample.json"))
    assert df.height == 1 and len(df["answers"][0]) > 1


def test_real_hotpotqa_both_files(shared_real):
    amor, _ = load_qa("hotpotqa", local(shared_real / "hotpotqa/amor/test.json"))  # JSONL despite .json
    assert amor.height == 500 and amor.filter(pl.col("type") == "comparison").height == 129
    prefix, _ = load_qa(
        "hotpotqa", local(shared_real / "hotpotqa/hotpot_fork_prefix/hotpot_dev_distractor_v1.first53.json")
    )
    assert prefix.height == 53
    assert prefix["question"][0] == "Were Scott Derrickson and Ed Wood of the same nationality?"
    assert prefix["answers"][0].to_list() == ["yes"]


def test_real_depthqa_questions_without_graph(shared_real):
    questions, nodes, report = load_depthqa(
        local(shared_real / "depthqa/outputs/inference/llama3_8b_zero-shot.json")
    )
    assert questions.height == 1571 and nodes.height == 0
    counts = dict(questions.group_by("depth").len().iter_rows())
    assert counts == {1: 1121, 2: 359, 3: 91}
