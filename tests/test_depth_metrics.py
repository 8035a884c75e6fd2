"""The DepthQA authors' metrics (truthflow.depth.metrics): mean score per depth, forward and backward
discrepancy, by hand on a small graph (the >= 4 gate, the first-successor rule in the authors' node order, the
two unparseable-verdict policies, n = 0), and on the shared run's demo scores against a second computation
written here."""

from __future__ import annotations

import math

import polars as pl
import pytest

from truthflow.data import NODES_SCHEMA
from truthflow.depth.metrics import METRICS_SCHEMA, depth_metrics, question_scores
from truthflow.depth.tables import NODE_COLUMNS
from truthflow.errors import TruthflowError

# D1 a1..a4, D2 b1..b3, D3 c1, c2; every node its own question q_<node>. a2's successors list b2 first, but
# b1 comes first in the table: the authors' first successor of a2 is b1.
GRAPH = {
    "a1": (1, [], ["b1"]),
    "a2": (1, [], ["b2", "b1"]),
    "a3": (1, [], ["b2"]),
    "a4": (1, [], ["b3"]),
    "b1": (2, ["a1", "a2"], ["c1"]),
    "b2": (2, ["a2", "a3"], ["c1"]),
    "b3": (2, ["a4"], ["c2"]),
    "c1": (3, ["b1", "b2"], []),
    "c2": (3, ["b3"], []),
}
# the issue's toy graph for the first-successor order (b3: a second node of b2's question)
TOY = {
    "a1": (1, [], ["b1"]),
    "a2": (1, [], ["b2", "b1"]),
    "b1": (2, ["a1", "a2"], []),
    "b2": (2, ["a2"], []),
    "b3": (2, [], []),
}
SCORES = {"a1": 5, "a2": 4, "a3": 3, "a4": 5, "b1": 3, "b2": 5, "b3": 4, "c1": 2, "c2": 5}


def nodes_table(graph: dict = GRAPH) -> pl.DataFrame:
    rows = [(n, "g", d, p, s, f"q_{n}") for n, (d, p, s) in graph.items()]
    schema = NODES_SCHEMA
    return pl.DataFrame(rows, schema=schema, orient="row").select(NODE_COLUMNS)


def per_question(judgments: dict, graph: dict = GRAPH, model: str = "m") -> pl.DataFrame:
    """judgments: node -> a score or a list of verdicts (None: unparseable)."""
    rows = [(model, f"q_{n}", graph[n][0], v if isinstance(v, list) else [v]) for n, v in judgments.items()]
    schema = {"model": pl.Utf8, "qid": pl.Utf8, "depth": pl.Int64, "judgments": pl.List(pl.Int64)}
    return pl.DataFrame(rows, schema=schema, orient="row")


def metric(table: pl.DataFrame, name: str, scope: str) -> dict:
    rows = table.filter((pl.col("metric") == name) & (pl.col("scope") == scope)).to_dicts()
    assert len(rows) == 1, (name, scope, rows)
    return rows[0]


def test_hand_case_every_metric() -> None:
    table = depth_metrics(per_question(SCORES), nodes_table())
    assert table.schema == pl.Schema(METRICS_SCHEMA)
    # mean score per depth: (5 + 4 + 3 + 5) / 4, (3 + 5 + 4) / 3, (2 + 5) / 2
    for scope, value, n in (("depth 1", 4.25, 4), ("depth 2", 4.0, 3), ("depth 3", 3.5, 2)):
        row = metric(table, "mean_score", scope)
        assert (row["n"], row["n_left_out"]) == (n, 0) and row["value"] == pytest.approx(value)
    # forward 1-2: b1 preds mean 4.5 -> (4.5 - 3) / 4 = 0.375; b2 preds mean 3.5 < 4, not counted;
    # b3 pred 5 -> (5 - 4) / 4 = 0.25. Mean over 2 counted nodes: 0.3125
    fwd = {s: metric(table, "forward_discrepancy", s) for s in ("1-2", "2-3", "overall")}
    assert (fwd["1-2"]["n"], fwd["1-2"]["value"]) == (2, pytest.approx(0.3125))
    # forward 2-3: c1 preds mean exactly 4 (the gate is >= 4) -> (4 - 2) / 4 = 0.5; c2: (4 - 5) / 4 -> 0
    assert (fwd["2-3"]["n"], fwd["2-3"]["value"]) == (2, pytest.approx(0.25))
    # overall pools the 4 counted nodes: (0.375 + 0.25 + 0.5 + 0) / 4
    assert (fwd["overall"]["n"], fwd["overall"]["value"]) == (4, pytest.approx(0.28125))
    # backward 1-2: a1's first successor b1 = 3 < 4, not counted; a2's first successor in table order is b1
    # too (its list names b2 first): not counted; a3: b2 = 5 -> 0.5; a4: b3 = 4 -> floored 0. Mean over 2
    bwd = {s: metric(table, "backward_discrepancy", s) for s in ("1-2", "2-3", "overall")}
    assert (bwd["1-2"]["n"], bwd["1-2"]["value"]) == (2, pytest.approx(0.25))
    # backward 2-3: b1, b2 -> c1 = 2 < 4; b3 -> c2 = 5: (5 - 4) / 4
    assert (bwd["2-3"]["n"], bwd["2-3"]["value"]) == (1, pytest.approx(0.25))
    assert (bwd["overall"]["n"], bwd["overall"]["value"]) == (3, pytest.approx(0.75 / 3))
    assert table["n_unparseable"].sum() == 0 and set(table["unparseable"]) == {"omit"}
    assert table.filter(pl.col("metric") != "mean_score")["depth"].to_list() == [2, 3, None] * 2


def test_gate_is_at_least_four() -> None:
    # c1's predecessors b1, b2 at 4 and 3 (mean 3.5): c1 is not counted; nor c2 (b3 = 3)
    scores = {**SCORES, "b1": 4, "b2": 3, "b3": 3}  # every D2 predecessors' mean below 4
    fwd = metric(depth_metrics(per_question(scores), nodes_table()), "forward_discrepancy", "2-3")
    assert fwd["n"] == 0 and fwd["value"] is None
    scores = {**SCORES, "b1": 4, "b2": 4}  # mean exactly 4: counted, (4 - 2) / 4
    fwd = metric(depth_metrics(per_question(scores), nodes_table()), "forward_discrepancy", "2-3")
    assert fwd["n"] == 2 and fwd["value"] == pytest.approx((0.5 + 0) / 2)


def toy_table(order: list[str], graph: dict, qid: dict) -> pl.DataFrame:
    """The nodes of `graph` in table order `order`, node -> its question in `qid`."""
    table = nodes_table({n: graph[n] for n in order})
    return table.with_columns(pl.col("nodeid").replace(qid).alias("qid"))


def test_first_successor_is_first_in_the_authors_node_order() -> None:
    """The issue's toy graph: a2's successors b1 (5) and b2 (3). Their backward_disc takes the first depth-2
    node of node_results (grouped by question, in table order) that names a2 a predecessor, whatever the
    order of a2's own direct_successors. a1's question is unparseable (0 under `zero`)."""
    judged = {"a1": [None], "a2": 4, "b1": 5, "b2": 3, "b3": 3}
    qid = {n: f"q_{n}" for n in judged} | {"b3": "q_b2"}  # b3 asks b2's question
    per_q = per_question({n: v for n, v in judged.items() if n != "b3"}, TOY)
    for listed in (["b2", "b1"], ["b1", "b2"]):
        graph = {**TOY, "a2": (1, [], listed)}

        def backward(order: list[str], graph=graph) -> tuple:
            table = depth_metrics(per_q, toy_table(order, graph, qid), unparseable="zero")
            row = metric(table, "backward_discrepancy", "1-2")
            return row["n"], row["value"]

        # b1 before b2: a1 (5 - 0) / 4 = 1.25 and a2 (5 - 4) / 4 = 0.25, mean 0.75
        assert backward(["a1", "a2", "b1", "b2", "b3"]) == (2, pytest.approx(0.75)), listed
        # b2 before b1: a2's first successor b2 = 3 < 4 is not counted, a1 alone: 1.25
        assert backward(["a1", "a2", "b2", "b1", "b3"]) == (1, pytest.approx(1.25)), listed
        # b2 after b1 in the table, but its question's first node b3 comes first: grouped there, b2 leads
        assert backward(["b3", "a1", "a2", "b1", "b2"]) == (1, pytest.approx(1.25)), listed


# one group listed in two orders: the nodes file puts 1_d2_n1 before 1_d2_n2, the node_to_q file the reverse
# (nothing makes the real dataset's two files agree); each node asks its own question q_<node>
FILE_GRAPH = {
    "1_d3": (3, ["1_d2_n1", "1_d2_n2"]),
    "1_d2_n1": (2, ["1_d1_n1", "1_d1_n2"]),
    "1_d2_n2": (2, ["1_d1_n1"]),
    "1_d1_n1": (1, []),
    "1_d1_n2": (1, []),
}
NODE_TO_Q_ORDER = ["1_d1_n2", "1_d1_n1", "1_d2_n2", "1_d2_n1", "1_d3"]
FILE_SCORES = {"1_d3": 3, "1_d2_n1": 5, "1_d2_n2": 4, "1_d1_n1": 2, "1_d1_n2": 5}


def write_graph_files(root, graph: dict, node_to_q_order: list[str]) -> None:
    """questions, nodes (in `graph`'s order) and node_to_q (in node_to_q_order) files of a local DepthQA."""
    import json

    def successors(n: str) -> list[str]:
        return [m for m, (_, preds) in graph.items() if n in preds]

    files = {
        "questions": [
            {"qid": f"q_{n}", "depth": d, "question": f"Q {n}?", "answer": f"A {n}."}
            for n, (d, _) in graph.items()
        ],
        "nodes": [
            {
                "nodeid": n,
                "group": "1",
                "depth": d,
                "direct_predecessors": p,
                "direct_successors": successors(n),
            }
            for n, (d, p) in graph.items()
        ],
        "node_to_q": [{"nodeid": n, "qid": f"q_{n}"} for n in node_to_q_order],
    }
    root.mkdir(parents=True, exist_ok=True)
    for name, records in files.items():
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_first_successor_follows_the_node_to_q_file_not_the_nodes_file(tmp_path) -> None:
    """The authors' node_results is filled in the order of their node_to_q file (dataloader.py), so the first
    successor is the first deeper node in that file, whatever order the nodes file lists them in."""
    from truthflow.data import load_depthqa

    write_graph_files(tmp_path / "depthqa", FILE_GRAPH, NODE_TO_Q_ORDER)
    _, nodes, _ = load_depthqa({"source": {"local": str(tmp_path / "depthqa")}, "n": None, "seed": 0})
    table = depth_metrics(per_question(FILE_SCORES, FILE_GRAPH), nodes)
    # backward 1-2, in node_to_q order (1_d2_n2 before 1_d2_n1): 1_d1_n1's first successor is 1_d2_n2 = 4,
    # (4 - 2) / 4 = 0.5; 1_d1_n2's only successor 1_d2_n1 = 5, (5 - 5) / 4 = 0. Mean over 2: 0.25. In the
    # nodes file's order 1_d1_n1's first successor would be 1_d2_n1 = 5: (5 - 2) / 4 = 0.75, mean 0.375
    bwd = {s: metric(table, "backward_discrepancy", s) for s in ("1-2", "2-3", "overall")}
    assert (bwd["1-2"]["n"], bwd["1-2"]["value"]) == (2, pytest.approx(0.25))
    # backward 2-3: both D2 nodes' first successor 1_d3 = 3 < 4, none counted; overall pools 1-2's two
    assert (bwd["2-3"]["n"], bwd["2-3"]["value"]) == (0, None)
    assert (bwd["overall"]["n"], bwd["overall"]["value"]) == (2, pytest.approx(0.25))
    # the rest takes no order: forward 1-2, 1_d2_n1's predecessors (2 + 5) / 2 = 3.5 and 1_d2_n2's 2 are
    # below 4; forward 2-3, 1_d3's (5 + 4) / 2 = 4.5, (4.5 - 3) / 4 = 0.375; means (2 + 5) / 2, (5 + 4) / 2, 3
    fwd = {s: metric(table, "forward_discrepancy", s) for s in ("1-2", "2-3", "overall")}
    assert [(fwd[s]["n"], fwd[s]["value"]) for s in fwd] == [(0, None), (1, 0.375), (1, 0.375)]
    means = [metric(table, "mean_score", f"depth {d}")["value"] for d in (1, 2, 3)]
    assert means == [3.5, 4.5, 3.0]
    assert nodes["nodeid"].to_list() == NODE_TO_Q_ORDER  # the order the metrics walk


def test_unparseable_left_out_or_zero() -> None:
    judged = {**SCORES, "a3": [None], "a1": [5, 4, None]}
    omit = depth_metrics(per_question(judged), nodes_table(), unparseable="omit")
    # a1 = mean(5, 4) = 4.5; a3 left out: D1 = (4.5 + 4 + 5) / 3
    d1 = metric(omit, "mean_score", "depth 1")
    assert (d1["n"], d1["n_left_out"], d1["n_unparseable"]) == (3, 1, 2)
    assert d1["value"] == pytest.approx(13.5 / 3)
    # backward 1-2: a1 and a2 (first successor b1 = 3) not counted, a3 left out, a4 0
    bwd = metric(omit, "backward_discrepancy", "1-2")
    assert (bwd["n"], bwd["n_left_out"], bwd["value"]) == (1, 1, pytest.approx(0.0))
    # forward 1-2: b2 (pred a3) left out; b1 preds (4.5 + 4) / 2 = 4.25 -> (4.25 - 3) / 4; b3 0.25
    fwd = metric(omit, "forward_discrepancy", "1-2")
    assert (fwd["n"], fwd["n_left_out"], fwd["value"]) == (2, 1, pytest.approx((0.3125 + 0.25) / 2))

    zero = depth_metrics(per_question(judged), nodes_table(), unparseable="zero")
    # a1 = (5 + 4 + 0) / 3 = 3; a3 = 0: D1 = (3 + 4 + 0 + 5) / 4
    d1 = metric(zero, "mean_score", "depth 1")
    assert (d1["n"], d1["n_left_out"], d1["value"]) == (4, 0, pytest.approx(3.0))
    # backward 1-2: a1, a2 (b1 = 3) no; a3 (b2 = 5) (5 - 0) / 4; a4 0
    bwd = metric(zero, "backward_discrepancy", "1-2")
    assert (bwd["n"], bwd["value"]) == (2, pytest.approx((1.25 + 0) / 2))
    # forward 1-2: b1 preds (3 + 4) / 2 < 4 no; b2 (4 + 0) / 2 no; b3 0.25
    fwd = metric(zero, "forward_discrepancy", "1-2")
    assert (fwd["n"], fwd["value"]) == (1, pytest.approx(0.25))


def test_no_verdict_row_counts_as_unparseable() -> None:
    table = per_question(SCORES).with_columns(
        pl.when(pl.col("qid") == "q_c2").then(None).otherwise(pl.col("judgments")).alias("judgments")
    )
    assert question_scores(table, "zero").filter(pl.col("qid") == "q_c2")["score"].to_list() == [0.0]
    assert question_scores(table, "omit").filter(pl.col("qid") == "q_c2")["score"].to_list() == [None]


def test_n_zero_rows_print_no_number_and_say_why() -> None:
    """Every score 3: no predecessors' mean and no successor reaches 4, so every discrepancy has n = 0."""
    table = depth_metrics(per_question(dict.fromkeys(GRAPH, 3)), nodes_table())
    disc = table.filter(pl.col("metric") != "mean_score")
    assert disc.height == 6 and disc["n"].to_list() == [0] * 6
    assert disc["value"].null_count() == 6 and disc["ci_low"].null_count() == 6
    assert all(note.startswith("n = 0: no ") and "reaches 4" in note for note in disc["note"])
    # every node left out (omit, nothing parsed) says so instead
    table = depth_metrics(per_question(dict.fromkeys(GRAPH, [None])), nodes_table())
    notes = table.filter(pl.col("metric") != "mean_score")["note"].to_list()
    assert notes == ["n = 0: every node was left out for a missing score"] * 6


def test_ci_over_questions() -> None:
    """A bootstrap CI brackets the mean; fewer than stats.MIN_CI_N values have none."""
    table = depth_metrics(per_question(SCORES), nodes_table())
    d1 = metric(table, "mean_score", "depth 1")  # 4 questions: no CI
    assert d1["ci_low"] is None and d1["ci_high"] is None
    many = {f"x{i}": (1, [], []) for i in range(40)}
    scores = {n: 3 + i % 3 for i, n in enumerate(many)}
    row = metric(depth_metrics(per_question(scores, many), nodes_table(many)), "mean_score", "depth 1")
    assert row["n"] == 40 and row["ci_low"] < row["value"] < row["ci_high"]
    assert 3.5 < row["ci_low"] and row["ci_high"] < 4.5


def test_bad_policy_and_missing_columns_are_one_clear_message() -> None:
    with pytest.raises(TruthflowError, match=r"depth\.metrics\.unparseable must be one of"):
        depth_metrics(per_question(SCORES), nodes_table(), unparseable="drop")
    with pytest.raises(TruthflowError, match=r"lacks column\(s\) \['judgments'\]"):
        depth_metrics(per_question(SCORES).drop("judgments"), nodes_table())


def test_without_a_graph_only_mean_scores() -> None:
    table = depth_metrics(per_question(SCORES), nodes_table().clear())
    assert set(table["metric"]) == {"mean_score"}


# ---------------------------------------------------------------- the shared run's demo scores


def independent_metrics(per_q: list[dict], nodes: list[dict]) -> dict:
    """The authors' definitions, written again from the issue's words over plain dicts, "omit" policy:
    {(metric, scope): (n, value)}."""
    score = {}
    for r in per_q:
        parsed = [v for v in (r["judgments"] or []) if v is not None]
        if parsed:
            score[r["qid"]] = sum(parsed) / len(parsed)
    out = {}
    for d in (1, 2, 3):
        vals = [score[r["qid"]] for r in per_q if r["depth"] == d and r["qid"] in score]
        out[("mean_score", f"depth {d}")] = (len(vals), sum(vals) / len(vals) if vals else None)
    node = {n["nodeid"]: n for n in nodes}
    node_score = {k: score.get(n["qid"]) for k, n in node.items()}
    # the authors' node_results order: grouped by question, in table order; a node's first successor is the
    # first deeper node in it that names the node a predecessor
    questions = list(dict.fromkeys(n["qid"] for n in nodes))
    ordered = [n for q in questions for n in nodes if n["qid"] == q]
    first = {(1, 2): {}, (2, 3): {}}
    for n in ordered:
        for p in n["direct_predecessors"]:
            if (node[p]["depth"], n["depth"]) in first:
                first[(node[p]["depth"], n["depth"])].setdefault(p, n["nodeid"])
    for name in ("forward_discrepancy", "backward_discrepancy"):
        everything = []
        for a, b in ((1, 2), (2, 3)):
            vals = []
            for k, n in node.items():
                if name == "forward_discrepancy" and n["depth"] == b:
                    preds = [node_score[p] for p in n["direct_predecessors"] if node[p]["depth"] == a]
                    if preds and None not in preds and node_score[k] is not None:
                        m = sum(preds) / len(preds)
                        if m >= 4:
                            vals.append(max(0.0, (m - node_score[k]) / 4))
                if name == "backward_discrepancy" and n["depth"] == a and k in first[(a, b)]:
                    succ = first[(a, b)][k]
                    if node_score[succ] is not None and node_score[k] is not None:
                        if node_score[succ] >= 4:
                            vals.append(max(0.0, (node_score[succ] - node_score[k]) / 4))
            everything += vals
            out[(name, f"{a}-{b}")] = (len(vals), sum(vals) / len(vals) if vals else None)
        out[(name, "overall")] = (len(everything), sum(everything) / len(everything) if everything else None)
    return out


def check_against_independent(metrics: pl.DataFrame, per_q: pl.DataFrame, nodes: pl.DataFrame) -> None:
    for model in per_q["model"].unique():
        mine = metrics.filter(pl.col("model") == model)
        other = independent_metrics(per_q.filter(pl.col("model") == model).to_dicts(), nodes.to_dicts())
        assert mine.height == len(other), model
        for r in mine.iter_rows(named=True):
            n, value = other[(r["metric"], r["scope"])]
            assert r["n"] == n, (model, r)
            assert (r["value"] is None) == (value is None), (model, r)
            if value is not None:
                assert math.isclose(r["value"], value, rel_tol=1e-12), (model, r)


@pytest.mark.workflow
@pytest.mark.model
def test_demo_metrics_agree_with_a_second_computation_and_every_discrepancy_is_n_zero(demo_run) -> None:
    """On the demo (tiny models, the offline reference judge) no predecessors' mean and no first successor
    reaches 4: every discrepancy row has n = 0 and no value, and its report table prints a dash."""
    tables = demo_run / "results" / "demo" / "tables"
    metrics = pl.read_parquet(tables / "depth_metrics.parquet")
    per_q = pl.read_parquet(tables / "depth_per_question.parquet")
    nodes = pl.read_parquet(demo_run / "results" / "demo" / "data" / "depthqa_nodes.parquet")
    check_against_independent(metrics, per_q, nodes)
    disc = metrics.filter(pl.col("metric") != "mean_score")
    assert disc.height == 6 * per_q["model"].n_unique()
    assert disc["n"].max() == 0 and disc["value"].null_count() == disc.height
    tsv = pl.read_csv(tables / "depth_metrics.tsv", separator="\t")
    assert tsv.filter(pl.col("metric") != "mean_score")["value"].null_count() == disc.height
