"""The real DepthQA question set (no graph): counts, and the no-graph path of the depth tables."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import polars as pl
import pytest

from truthflow.config import schema_defaults
from truthflow.depth.judge import judge_all
from truthflow.depth.tables import depthwise_average, pooled_by_depth, score_gaps

REAL = (
    Path(__file__).resolve().parents[2]
    / "shared"
    / "data/real/depthqa/outputs/inference/llama3_8b_zero-shot.json"
)


@pytest.fixture(scope="module")
def real() -> dict:
    if not REAL.exists():
        pytest.skip(f"real DepthQA outputs not present at {REAL}")
    return json.loads(REAL.read_text())


def fake_mink(qid: str, depth: int) -> float:
    # deterministic stand-in for a model's MIN-K%, rising with depth like the published figure
    return depth + (zlib.crc32(qid.encode()) % 1000) / 1000


def test_real_question_counts(real) -> None:
    assert len(real) == 1571
    depths = pl.Series([v["depth"] for v in real.values()]).value_counts().sort("")
    assert dict(depths.iter_rows()) == {1: 1121, 2: 359, 3: 91}
    assert all(qid == v["qid"] and qid.startswith(f"d{v['depth']}_") for qid, v in real.items())


def test_pooled_by_depth_on_the_real_questions(real) -> None:
    per_question = pl.DataFrame(
        {
            "model": "llama3_8b",
            "qid": list(real),
            "depth": [v["depth"] for v in real.values()],
            "mink_20": [fake_mink(q, v["depth"]) for q, v in real.items()],
        }
    )
    pooled = pooled_by_depth(per_question, k=20)
    assert pooled["n"].to_list() == [1121, 359, 91]
    assert pooled["mean"].is_sorted()
    for row in pooled.iter_rows(named=True):
        assert row["depth"] < row["q25"] <= row["median"] <= row["q75"] < row["depth"] + 1

    # no graph: the group tables are empty, not an error
    no_nodes = pl.DataFrame()
    assert depthwise_average(per_question, no_nodes, k=20).height == 0
    gaps, excluded = score_gaps(per_question.with_columns(score=pl.lit(5)), no_nodes)
    assert (gaps.height, excluded) == (0, 0)


def test_reference_judge_on_real_answers(real, tmp_path) -> None:
    rows = [
        {"qid": q, "question": v["question"], "answer": v["predicted_answer"], "reference": v["answer"]}
        for q, v in list(real.items())[:25]
    ]
    table = judge_all(rows, schema_defaults("depth", "judge"), tmp_path / "judge.jsonl", progress=False)
    assert table.height == 25 and table["score"].null_count() == 0
    assert table["score"].is_between(1, 5).all()
