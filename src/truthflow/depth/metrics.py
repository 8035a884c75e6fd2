"""The DepthQA authors' metrics (Ko et al., EMNLP 2024; docs/depthqa_authors.md), next to the score gap of
METHOD B4, from the per-question table (model, qid, depth, judgments) and the graph (tables.NODE_COLUMNS):

- mean score per depth, over that depth's questions, with a bootstrap 95% CI;
- forward discrepancy, per depth pair (a, b) = (1, 2) and (2, 3): for each node of depth b, p = the mean
  score of its direct predecessors of depth a and s = its own score; counted only where p >= 4; its value
  max(0, (p - s) / 4). The pair's discrepancy is the mean over the counted nodes; "overall" pools the counted
  nodes of both pairs;
- backward discrepancy, per pair: for each node of depth a, s = its own score and f = the score of its first
  direct successor of depth b (first in its `direct_successors` list); counted only where f >= 4; its value
  max(0, (f - s) / 4); means as above.

The discrepancies are over graph nodes (a question two nodes share counts once per node), the mean scores over
questions, as in the authors' code. A question's score is the mean of its verdicts. An unparseable verdict
(`unparseable`): "zero" scores it 0 (the authors' compute_score, where a verdict without a score is 0);
"omit" leaves it out of its question's mean, a question without a parsed verdict out of the mean score, and a
node whose score or whose predecessors' or successor's score is missing out of the discrepancy; the rows
count what they left out. A row with n = 0 has no value: its note says why."""

from __future__ import annotations

import numpy as np
import polars as pl

from ..errors import TruthflowError
from ..stats import bootstrap_ci
from .tables import NODE_COLUMNS

PAIRS = ((1, 2), (2, 3))
GATE = 4  # the authors count a node only where the shallower side's score reaches this
UNPARSEABLE = ("omit", "zero")
METRICS_SCHEMA = {
    "model": pl.Utf8,
    "metric": pl.Utf8,  # mean_score | forward_discrepancy | backward_discrepancy
    "scope": pl.Utf8,  # mean_score: "depth 1".."depth 3"; discrepancies: "1-2", "2-3", "overall"
    "depth": pl.Int64,  # mean_score: the depth; discrepancies: the deeper depth of the pair, null overall
    "n": pl.Int64,  # questions (mean_score) or counted nodes (discrepancies)
    "value": pl.Float64,  # null where n = 0
    "ci_low": pl.Float64,  # bootstrap 95% CI over questions / counted nodes; null below stats.MIN_CI_N
    "ci_high": pl.Float64,
    "n_left_out": pl.Int64,  # unparseable "omit": questions / nodes left out for a missing score
    "n_unparseable": pl.Int64,  # verdicts that did not parse among this row's questions or nodes
    "unparseable": pl.Utf8,  # the policy
    "note": pl.Utf8,
}


def question_scores(per_question_df: pl.DataFrame, unparseable: str) -> pl.DataFrame:
    """model, qid, depth, score (null: left out), n_unparseable: one question's score under the policy."""
    if unparseable not in UNPARSEABLE:
        raise TruthflowError(f"depth.metrics.unparseable must be one of {UNPARSEABLE}, got {unparseable!r}")
    missing = [c for c in ("model", "qid", "depth", "judgments") if c not in per_question_df.columns]
    if missing:
        raise TruthflowError(f"per-question table lacks column(s) {missing} (has {per_question_df.columns})")
    rows = []
    for model, qid, depth, verdicts in per_question_df.select(
        "model", "qid", "depth", "judgments"
    ).iter_rows():
        # no verdict row: one that did not parse
        verdicts = list(verdicts) if verdicts is not None else [None]
        parsed = [v for v in verdicts if v is not None]
        if unparseable == "zero":
            score = sum(parsed) / len(verdicts)
        else:
            score = sum(parsed) / len(parsed) if parsed else None
        rows.append((model, qid, depth, score, len(verdicts) - len(parsed)))
    schema = {"model": pl.Utf8, "qid": pl.Utf8, "depth": pl.Int64, "score": pl.Float64}
    schema |= {"n_unparseable": pl.Int64}
    return pl.DataFrame(rows, schema=schema, orient="row")


def _row(model, metric, scope, depth, values, left_out, n_bad, policy, note, boot) -> dict:
    values = np.asarray(values, dtype=float)
    lo, hi = bootstrap_ci(values, *boot) if len(values) else (float("nan"), float("nan"))
    return {
        "model": model, "metric": metric, "scope": scope, "depth": depth, "n": len(values),
        "value": float(values.mean()) if len(values) else None,
        "ci_low": None if np.isnan(lo) else lo, "ci_high": None if np.isnan(hi) else hi,
        "n_left_out": left_out, "n_unparseable": n_bad, "unparseable": policy, "note": note,
    }  # fmt: skip


def _why_empty(looked: int, left_out: int, gate_side: str) -> str:
    """The note of a discrepancy with n = 0."""
    if looked == 0:
        return "n = 0: no node of the pair has a neighbour at the other depth"
    if left_out == looked:
        return "n = 0: every node was left out for a missing score"
    return f"n = 0: no {gate_side} reaches {GATE}, so no node is counted"


def _node_scores(nodes_df: pl.DataFrame, scores: pl.DataFrame) -> tuple[dict, dict, dict]:
    """nodeid -> node, nodeid -> score (absent: left out), nodeid -> its question's unparseable verdicts."""
    nodes = {rec["nodeid"]: rec for rec in nodes_df.select(NODE_COLUMNS).iter_rows(named=True)}
    by_q = {
        qid: (score, bad) for qid, score, bad in scores.select("qid", "score", "n_unparseable").iter_rows()
    }
    score_of = {
        n: by_q[r["qid"]][0] for n, r in nodes.items() if r["qid"] in by_q and by_q[r["qid"]][0] is not None
    }
    bad_of = {n: by_q[r["qid"]][1] if r["qid"] in by_q else 0 for n, r in nodes.items()}
    return nodes, score_of, bad_of


def forward_values(nodes: dict, score_of: dict, bad_of: dict, a: int, b: int) -> tuple[list, int, int, int]:
    """(the counted nodes' values, nodes left out, unparseable verdicts among the nodes looked at, nodes
    looked at)."""
    values, left_out, bad, looked = [], 0, 0, 0
    for nodeid, rec in sorted(nodes.items()):
        preds = [p for p in rec["direct_predecessors"] if nodes[p]["depth"] == a]
        if rec["depth"] != b or not preds:
            continue
        looked += 1
        bad += bad_of[nodeid] + sum(bad_of[p] for p in preds)
        if nodeid not in score_of or any(p not in score_of for p in preds):
            left_out += 1
            continue
        pred_mean = sum(score_of[p] for p in preds) / len(preds)
        if pred_mean >= GATE:
            values.append(max(0.0, (pred_mean - score_of[nodeid]) / 4))
    return values, left_out, bad, looked


def backward_values(nodes: dict, score_of: dict, bad_of: dict, a: int, b: int) -> tuple[list, int, int, int]:
    values, left_out, bad, looked = [], 0, 0, 0
    for nodeid, rec in sorted(nodes.items()):
        succs = [s for s in rec["direct_successors"] if nodes[s]["depth"] == b]
        if rec["depth"] != a or not succs:
            continue
        first = succs[0]  # the first-successor rule: the other successors play no part
        looked += 1
        bad += bad_of[nodeid] + bad_of[first]
        if nodeid not in score_of or first not in score_of:
            left_out += 1
            continue
        if score_of[first] >= GATE:
            values.append(max(0.0, (score_of[first] - score_of[nodeid]) / 4))
    return values, left_out, bad, looked


DISCREPANCIES = {
    "forward_discrepancy": (forward_values, "predecessors' mean score"),
    "backward_discrepancy": (backward_values, "first successor's score"),
}


def depth_metrics(
    per_question_df: pl.DataFrame,
    nodes_df: pl.DataFrame,
    unparseable: str = "omit",
    n_boot: int = 2000,
    seed: int = 0,
) -> pl.DataFrame:
    """Per model: mean score per depth, forward and backward discrepancy per pair and overall (METRICS_SCHEMA,
    long). Without a graph (empty nodes table) only the mean scores."""
    scores = question_scores(per_question_df, unparseable)
    if nodes_df.height:
        missing = [c for c in NODE_COLUMNS if c not in nodes_df.columns]
        if missing:
            raise TruthflowError(f"nodes table lacks column(s) {missing} (has {nodes_df.columns})")
    boot = (n_boot, seed)
    rows = []
    for (model,), sub in sorted(scores.group_by("model")):
        for depth in (1, 2, 3):
            at = sub.filter(pl.col("depth") == depth)
            kept = at["score"].drop_nulls().to_list()
            left, bad = at.height - len(kept), int(at["n_unparseable"].sum())
            note = (
                f"over the questions of depth {depth}"
                if kept
                else f"n = 0: no scored question of depth {depth}"
            )
            rows.append(
                _row(model, "mean_score", f"depth {depth}", depth, kept, left, bad, unparseable, note, boot)
            )
        if not nodes_df.height:
            continue
        nodes, score_of, bad_of = _node_scores(nodes_df, sub)
        for metric, (values_of, gate_side) in DISCREPANCIES.items():
            per_pair = [((a, b), *values_of(nodes, score_of, bad_of, a, b)) for a, b in PAIRS]
            for (a, b), values, left, bad, looked in per_pair:
                note = f"depth {a} <-> depth {b}" if values else _why_empty(looked, left, gate_side)
                rows.append(_row(model, metric, f"{a}-{b}", b, values, left, bad, unparseable, note, boot))
            pooled = [v for _, values, *_ in per_pair for v in values]
            left, bad, looked = (sum(p[i] for p in per_pair) for i in (2, 3, 4))
            note = "both pairs' counted nodes" if pooled else _why_empty(looked, left, gate_side)
            rows.append(_row(model, metric, "overall", None, pooled, left, bad, unparseable, note, boot))
    return pl.DataFrame(rows, schema=METRICS_SCHEMA)
