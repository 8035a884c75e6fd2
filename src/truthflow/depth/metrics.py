"""The DepthQA authors' metrics (Ko et al., EMNLP 2024; docs/depthqa_authors.md), next to METHOD B4's score
gap, from the per-question table (model, qid, depth, judgments) and the graph (tables.NODE_COLUMNS): the mean
score per depth over its questions, with a bootstrap 95% CI; the forward discrepancy per depth pair (a, b) =
(1, 2), (2, 3): over the nodes of depth b whose direct predecessors of depth a have a mean score p >= 4, the
mean of max(0, (p - s) / 4), s the node's own score ("overall" pools both pairs' nodes); the backward
discrepancy: the same over the nodes of depth a, p the score of the first successor of depth b, first in the
order the authors' node_results is built (grouped by question, questions in the order of their first node,
nodes in table order; data.load_depthqa gives the table the node_to_q file's order, as their dataloader reads
it), not the node's own direct_successors order nor the nodes file's.
Discrepancies are over graph nodes (a question two nodes share counts once per node), mean scores over
questions, as in the authors' code. A question's score is the mean of its verdicts. An unparseable verdict:
`unparseable` "zero" scores it 0 (the authors' compute_score); "omit" leaves it out of its question's mean, a
question without a parsed verdict out of the mean score, a node missing its own or a neighbour's score out of
the discrepancy; rows count what they left out, and one with n = 0 has a note saying why."""

from functools import partial

import numpy as np
import polars as pl

from ..errors import TruthflowError
from ..stats import bootstrap_ci
from .tables import node_records, require_columns

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
DISCREPANCIES = {
    "forward_discrepancy": (True, "predecessors' mean score"),
    "backward_discrepancy": (False, "first successor's score"),
}


def question_scores(per_question_df: pl.DataFrame, unparseable: str) -> pl.DataFrame:
    """model, qid, depth, score (null: left out), n_unparseable: one question's score under the policy."""
    if unparseable not in UNPARSEABLE:
        raise TruthflowError(f"depth.metrics.unparseable must be one of {UNPARSEABLE}, got {unparseable!r}")
    columns, rows = ("model", "qid", "depth", "judgments"), []
    require_columns(per_question_df, columns, "per-question table")
    for model, qid, depth, verdicts in per_question_df.select(columns).iter_rows():
        # no verdict row: one that did not parse
        verdicts = list(verdicts) if verdicts is not None else [None]
        parsed = [v for v in verdicts if v is not None]
        denominator = len(verdicts) if unparseable == "zero" else len(parsed)
        score = sum(parsed) / denominator if denominator else None
        rows.append((model, qid, depth, score, len(verdicts) - len(parsed)))
    schema = dict(model=pl.Utf8, qid=pl.Utf8, depth=pl.Int64, score=pl.Float64, n_unparseable=pl.Int64)
    return pl.DataFrame(rows, schema=schema, orient="row")


def _row(model, metric, scope, depth, values, left_out, n_bad, note, *, policy, boot) -> dict:
    values = np.asarray(values, dtype=float)
    lo, hi = bootstrap_ci(values, *boot) if len(values) else (float("nan"), float("nan"))
    return {
        "model": model,
        "metric": metric,
        "scope": scope,
        "depth": depth,
        "n": len(values),
        "value": float(values.mean()) if len(values) else None,
        "ci_low": None if np.isnan(lo) else lo,
        "ci_high": None if np.isnan(hi) else hi,
        "n_left_out": left_out,
        "n_unparseable": n_bad,
        "unparseable": policy,
        "note": note,
    }


def _why_empty(looked: int, left_out: int, gate_side: str) -> str:
    if looked == 0:
        return "n = 0: no node of the pair has a neighbour at the other depth"
    if left_out == looked:
        return "n = 0: every node was left out for a missing score"
    return f"n = 0: no {gate_side} reaches {GATE}, so no node is counted"


def _node_scores(nodes: dict, scores: pl.DataFrame) -> tuple[dict, dict]:
    """nodeid -> score (absent: left out), nodeid -> its question's unparseable verdicts."""
    by_q = {q: (score, bad) for q, score, bad in scores.select("qid", "score", "n_unparseable").iter_rows()}
    score_of = {n: by_q[r["qid"]][0] for n, r in nodes.items() if by_q.get(r["qid"], (None,))[0] is not None}
    return score_of, {n: by_q.get(r["qid"], (None, 0))[1] for n, r in nodes.items()}


def first_successors(nodes: dict, a: int, b: int) -> dict[str, str]:
    """Node of depth a -> its first successor of depth b: the first node of depth b, in the authors' order,
    that names it a direct predecessor (their backward_disc takes aggregate[aid][0])."""
    by_question: dict[str, list[str]] = {}
    for nodeid, rec in nodes.items():
        by_question.setdefault(rec["qid"], []).append(nodeid)
    first: dict[str, str] = {}
    for nodeid in (n for group in by_question.values() for n in group):
        if nodes[nodeid]["depth"] == b:
            for p in nodes[nodeid]["direct_predecessors"]:
                if nodes[p]["depth"] == a:
                    first.setdefault(p, nodeid)
    return first


def discrepancy_values(
    nodes: dict, score_of: dict, bad_of: dict, a: int, b: int, forward: bool
) -> tuple[list, int, int, int]:
    """One pair and direction (module docstring) -> (values, left out, unparseable verdicts, nodes seen)."""
    values, left_out, bad, looked = [], 0, 0, 0
    first = {} if forward else first_successors(nodes, a, b)
    for nodeid, rec in sorted(nodes.items()):
        if forward:
            depth, others = b, [p for p in rec["direct_predecessors"] if nodes[p]["depth"] == a]
        else:
            depth, others = a, [first[nodeid]] if nodeid in first else []
        if rec["depth"] != depth or not others:
            continue
        looked += 1
        bad += bad_of[nodeid] + sum(bad_of[o] for o in others)
        if nodeid not in score_of or any(o not in score_of for o in others):
            left_out += 1
            continue
        other_mean = sum(score_of[o] for o in others) / len(others)
        if other_mean >= GATE:
            values.append(max(0.0, (other_mean - score_of[nodeid]) / 4))
    return values, left_out, bad, looked


def depth_metrics(
    per_question_df: pl.DataFrame,
    nodes_df: pl.DataFrame,
    unparseable: str = "omit",
    n_boot: int = 2000,
    seed: int = 0,
) -> pl.DataFrame:
    """Per model, long: mean score per depth and, with a graph, the discrepancies per pair and overall."""
    scores, nodes = question_scores(per_question_df, unparseable), node_records(nodes_df)
    row, rows = partial(_row, policy=unparseable, boot=(n_boot, seed)), []
    for (model,), sub in sorted(scores.group_by("model")):
        for d in (1, 2, 3):
            at = sub.filter(pl.col("depth") == d)
            kept = at["score"].drop_nulls().to_list()
            left, bad = at.height - len(kept), int(at["n_unparseable"].sum())
            note = f"over the questions of depth {d}" if kept else f"n = 0: no scored question of depth {d}"
            rows.append(row(model, "mean_score", f"depth {d}", d, kept, left, bad, note))
        if not nodes:
            continue
        score_of, bad_of = _node_scores(nodes, sub)
        for metric, (forward, gate_side) in DISCREPANCIES.items():
            per_pair = [discrepancy_values(nodes, score_of, bad_of, a, b, forward) for a, b in PAIRS]
            for (a, b), (values, left, bad, looked) in zip(PAIRS, per_pair, strict=True):
                note = f"depth {a} <-> depth {b}" if values else _why_empty(looked, left, gate_side)
                rows.append(row(model, metric, f"{a}-{b}", b, values, left, bad, note))
            pooled = [v for values, *_ in per_pair for v in values]
            left, bad, looked = (sum(p[i] for p in per_pair) for i in (1, 2, 3))
            note = "both pairs' counted nodes" if pooled else _why_empty(looked, left, gate_side)
            rows.append(row(model, metric, "overall", None, pooled, left, bad, note))
    return pl.DataFrame(rows, schema=METRICS_SCHEMA)
