"""DepthQA tables (METHOD B2, B4, B5) on a hand-built graph with hand-computed values."""

from __future__ import annotations

import polars as pl
import pytest

from truthflow.data import NODES_SCHEMA
from truthflow.depth.tables import (
    d3_mink_by_group,
    depthwise_average,
    group_members,
    memorization_split,
    pooled_by_depth,
    score_gaps,
)
from truthflow.errors import TruthflowError


def node(nodeid: str, qid: str, preds: list[str] = (), succs: list[str] = ()) -> dict:
    depth = int(nodeid.split("_")[1][1])
    return {
        "nodeid": nodeid,
        "group": nodeid.split("_")[0],
        "depth": depth,
        "direct_predecessors": list(preds),
        "direct_successors": list(succs),
        "qid": qid,
    }


# group 1: D3 ← two D2 that share one D1; group 2: a chain; group 3: a lone D3; group 4: D3 ← D2 without D1
NODES = pl.DataFrame(
    [
        node("1_d3", "d3_q1", ["1_d2_n1", "1_d2_n2"]),
        node("1_d2_n1", "d2_q1", ["1_d1_n1", "1_d1_n2"], ["1_d3"]),
        node("1_d2_n2", "d2_q2", ["1_d1_n2", "1_d1_n3"], ["1_d3"]),
        node("1_d1_n1", "d1_q1", [], ["1_d2_n1"]),
        node("1_d1_n2", "d1_q2", [], ["1_d2_n1", "1_d2_n2"]),
        node("1_d1_n3", "d1_q3", [], ["1_d2_n2"]),
        node("2_d3", "d3_q2", ["2_d2_n1"]),
        node("2_d2_n1", "d2_q3", ["2_d1_n1"], ["2_d3"]),
        node("2_d1_n1", "d1_q4", [], ["2_d2_n1"]),
        node("3_d3", "d3_q3"),
        node("4_d3", "d3_q4", ["4_d2_n1"]),
        node("4_d2_n1", "d2_q4", [], ["4_d3"]),
    ],
    schema=NODES_SCHEMA,
)

MINK = {
    # group 1
    "d1_q1": 1.0,
    "d1_q2": 2.0,
    "d1_q3": 6.0,
    "d2_q1": 3.0,
    "d2_q2": 5.0,
    "d3_q1": 7.0,
    # group 2
    "d1_q4": 2.0,
    "d2_q3": 4.0,
    "d3_q2": 5.0,
    # group 3
    "d3_q3": 9.0,
    # group 4
    "d2_q4": 1.0,
    "d3_q4": 3.0,
}
SCORE = {"d3_q1": 4, "d2_q1": 5, "d2_q2": 2, "d3_q2": 2, "d2_q3": 5, "d3_q3": 5, "d2_q4": None, "d3_q4": 5}


def questions() -> pl.DataFrame:
    qids = sorted(MINK)
    return pl.DataFrame(
        {
            "id": qids,
            "dataset": ["depthqa"] * len(qids),
            "question": [f"question {q}?" for q in qids],
            "answers": [[f"reference {q}"] for q in qids],
            "depth": [int(q[1]) for q in qids],
            "reference_answer": [f"reference {q}" for q in qids],
        }
    )


def per_question(model: str = "m") -> pl.DataFrame:
    qids = sorted(MINK)
    return pl.DataFrame(
        {
            "model": [model] * len(qids),
            "qid": qids,
            "depth": [int(q[1]) for q in qids],
            "mink_20": [MINK[q] for q in qids],
            "score": [SCORE.get(q) for q in qids],
        },
        schema_overrides={"score": pl.Int64},
    )


def test_group_members_follow_predecessors() -> None:
    members = group_members(NODES)
    group1 = members.filter(pl.col("group") == "1")["nodeid"].to_list()
    assert sorted(group1) == ["1_d1_n1", "1_d1_n2", "1_d1_n3", "1_d2_n1", "1_d2_n2", "1_d3"]
    assert members.filter(pl.col("group") == "3")["nodeid"].to_list() == ["3_d3"]


def test_depthwise_average_hand_values() -> None:
    table = depthwise_average(per_question(), NODES, k=20)
    got = {(r["group"], r["depth"]): (r["mink"], r["n_questions"]) for r in table.iter_rows(named=True)}
    assert got == {
        ("1", 1): (3.0, 3),  # (1 + 2 + 6) / 3: the shared d1_q2 counts once
        ("1", 2): (4.0, 2),  # (3 + 5) / 2
        ("1", 3): (7.0, 1),
        ("2", 1): (2.0, 1),
        ("2", 2): (4.0, 1),
        ("2", 3): (5.0, 1),
        ("3", 3): (9.0, 1),
        ("4", 2): (1.0, 1),
        ("4", 3): (3.0, 1),
    }
    assert set(table["k"]) == {"20"} and set(table["model"]) == {"m"}


def test_depthwise_average_per_model() -> None:
    two = pl.concat([per_question("m"), per_question("n").with_columns(pl.col("mink_20") * 2)])
    table = depthwise_average(two, NODES, k=20)
    row = table.filter((pl.col("model") == "n") & (pl.col("group") == "1") & (pl.col("depth") == 1))
    assert row["mink"].item() == pytest.approx(6.0)


def test_score_gaps_hand_values_and_exclusions() -> None:
    gaps, excluded = score_gaps(per_question(), NODES)
    by_group = {r["group"]: r for r in gaps.iter_rows(named=True)}
    assert by_group["1"]["gap"] == pytest.approx((4 - (5 + 2) / 2) / 4)  # 0.125
    assert by_group["1"]["n_d2"] == 2 and by_group["1"]["d2_mean_score"] == pytest.approx(3.5)
    assert by_group["2"]["gap"] == pytest.approx((2 - 5) / 4)  # −0.75
    assert by_group["3"]["gap"] is None and by_group["3"]["excluded"] == "no D2 predecessor"
    assert by_group["4"]["gap"] is None and by_group["4"]["excluded"] == "D2 score missing (d2_q4)"
    assert excluded == 2
    assert by_group["1"]["excluded"] is None


def test_score_gap_missing_d3_score_is_excluded() -> None:
    pq = per_question().with_columns(
        pl.when(pl.col("qid") == "d3_q2").then(None).otherwise(pl.col("score")).alias("score")
    )
    gaps, excluded = score_gaps(pq, NODES)
    assert gaps.filter(pl.col("group") == "2")["excluded"].item() == "D3 score missing (d3_q2)"
    assert excluded == 3


def test_memorization_split_quartiles() -> None:
    gaps = pl.DataFrame(
        {
            "model": ["m"] * 6 + ["n"] * 4,
            "group": ["g1", "g2", "g3", "g4", "g5", "gx", "g1", "g2", "g3", "g4"],
            "gap": [0.1, 0.2, 0.3, 0.4, 0.5, None, -0.1, -0.2, -0.3, -0.4],
        }
    )
    d3 = pl.DataFrame(
        {
            "model": ["m"] * 6 + ["n"] * 4,
            "group": ["g1", "g2", "g3", "g4", "g5", "gx", "g1", "g2", "g3", "g4"],
            "mink": [1.0, 2.0, 3.0, 4.0, 5.0, 0.0, 10.0, 20.0, 30.0, 40.0],
        }
    )
    split = memorization_split(gaps, d3)
    members = {key: sorted(part["group"]) for key, part in split.group_by("model", "subset")}
    # m over g1..g5 (gx has no gap): linear quartiles 2 and 4; n: 17.5 and 32.5
    assert members == {
        ("m", "25%"): ["g1", "g2"],
        ("m", "75%"): ["g4", "g5"],
        ("n", "25%"): ["g1"],
        ("n", "75%"): ["g4"],
    }
    thresholds = {(r["model"], r["side"]): r["threshold"] for r in split.iter_rows(named=True)}
    assert thresholds == {
        ("m", "lower"): 2.0,
        ("m", "upper"): 4.0,
        ("n", "lower"): 17.5,
        ("n", "upper"): 32.5,
    }
    other = memorization_split(gaps, d3, lower_q=0.4, upper_q=0.6)
    assert set(other["subset"]) == {"40%", "60%"}


def test_memorization_split_bad_quantiles() -> None:
    with pytest.raises(TruthflowError, match="quantiles"):
        memorization_split(pl.DataFrame(), pl.DataFrame({"model": [], "group": [], "mink": []}), 0.8, 0.2)


def test_split_end_to_end_on_the_graph() -> None:
    depthwise = depthwise_average(per_question(), NODES, k=20)
    gaps, _ = score_gaps(per_question(), NODES)
    split = memorization_split(gaps, d3_mink_by_group(depthwise))
    # gaps exist for groups 1 (D3 MIN-K% 7) and 2 (5): the lower quartile is 5.5, the upper 6.5
    assert split.filter(pl.col("subset") == "25%")["group"].to_list() == ["2"]
    assert split.filter(pl.col("subset") == "75%")["group"].to_list() == ["1"]


def test_no_graph_gives_empty_tables() -> None:
    empty = NODES.clear()
    assert depthwise_average(per_question(), empty, k=20).height == 0
    gaps, excluded = score_gaps(per_question(), empty)
    assert gaps.height == 0 and excluded == 0
    assert memorization_split(gaps, pl.DataFrame({"model": [], "group": [], "mink": []})).height == 0
    # a parquet written from an empty table may have no columns at all
    assert depthwise_average(per_question(), pl.DataFrame(), k=20).height == 0


def test_pooled_by_depth_hand_values() -> None:
    table = pooled_by_depth(per_question(), k=20)
    d1 = table.filter(pl.col("depth") == 1).row(0, named=True)
    # D1 values 1, 2, 6, 2 → sorted 1, 2, 2, 6
    assert d1["n"] == 4
    assert d1["mean"] == pytest.approx(2.75)
    assert d1["median"] == pytest.approx(2.0)
    assert d1["q25"] == pytest.approx(1.75) and d1["q75"] == pytest.approx(3.0)
    assert table["depth"].to_list() == [1, 2, 3]


def test_per_question_needs_its_columns() -> None:
    with pytest.raises(TruthflowError, match="mink_30"):
        pooled_by_depth(per_question(), k=30)


def test_figures_draw_from_thin_and_empty_tables(tmp_path) -> None:
    from truthflow.depth.plots import plot_depth_boxes, plot_score_gap_density

    depthwise = depthwise_average(per_question(), NODES, k=20)
    gaps, _ = score_gaps(per_question(), NODES)
    split = memorization_split(gaps, d3_mink_by_group(depthwise))  # one group per subset: no KDE possible
    titles = {"m": "Model M"}
    cases = {
        "boxes": (plot_depth_boxes, depthwise),
        "boxes_empty": (plot_depth_boxes, depthwise.clear()),
        "density": (plot_score_gap_density, split),
        "density_empty": (plot_score_gap_density, split.clear()),
    }
    for name, (plot, table) in cases.items():
        plot(table, ["m", "absent"], titles, tmp_path / f"{name}.png", tmp_path / f"{name}.pdf", "caption")
        assert (tmp_path / f"{name}.png").stat().st_size > 0 and (tmp_path / f"{name}.pdf").stat().st_size > 0
