"""The falsification test of the pathways finding (E_Q knockout vs a matched random control): the matched
control draw, the verdict on hand-computed cases, and the negative control run on a real model — with
`pathways.knockout.target: random` the check must not say "holds"."""

from __future__ import annotations

import numpy as np
import polars as pl
from conftest import REPO, checkout_config, copy_run, snakemake, write_config

from truthflow import validate
from truthflow.compare import compare
from truthflow.config import schema_defaults
from truthflow.pathways.check import HOLDS, INCONCLUSIVE, NOT_HOLD, check, family, per_sample_means
from truthflow.pathways.extract import control_positions, knockout_blocks


def test_control_blocks_exactly_eq_count_outside_eq_and_is_seeded():
    a = control_positions("s1", [3, 4], list(range(10)), seed=0)
    assert a == control_positions("s1", [3, 4], list(range(10)), seed=0)
    assert len(a) == 2 and not set(a) & {3, 4} and set(a) <= set(range(10))
    draws = {tuple(control_positions("s1", [3, 4], list(range(10)), seed=0, draw=d)) for d in range(5)}
    assert len(draws) > 1  # draws differ
    # fewer non-E_Q tokens than |E_Q|: no shorter set, None (the sample is counted as unmatched)
    assert control_positions("s1", [1, 2, 3], [1, 2, 3, 4], seed=0) is None
    assert control_positions("s1", [1, 2], [1, 2, 3, 4], seed=0) == [3, 4]


def test_knockout_blocks_target_and_unmatched():
    kept = pl.DataFrame(
        {
            "id": ["a", "b"],
            "eq_positions": [[1, 2], [1, 2, 3]],
            "question_positions": [[0, 1, 2, 3, 4, 5], [1, 2, 3, 4]],
        }
    )
    target, controls, matched = knockout_blocks(kept, "exact_question", 3, 0)
    assert target == [[1, 2], [1, 2, 3]] and matched == [True, False]
    assert len(controls) == 3 and all(len(c[0]) == 2 for c in controls) and all(c[1] == [] for c in controls)
    rnd, _, _ = knockout_blocks(kept, "random", 3, 0)
    assert len(rnd[0]) == 2 and not set(rnd[0]) & {1, 2}


def _samples(target_flip, control_flip, target_dp, control_dp, layers=2) -> pl.DataFrame:
    rows = []
    for knockout, flips, dps in (("target", target_flip, target_dp), ("control", control_flip, control_dp)):
        for i, (f, d) in enumerate(zip(flips, dps, strict=True)):
            for layer in range(1, layers + 1):
                rows.append(
                    {
                        "id": f"s{i}",
                        "layer": layer,
                        "knockout": knockout,
                        "label": i % 2 == 0,
                        "matched": True,
                        "flip_rate": f,
                        "delta_p": d * layer / layers,  # deeper layers carry more of the effect
                    }
                )
    return pl.DataFrame(rows)


AUC = pl.DataFrame({"layer": [1, 2], "auc": [0.8, 0.8], "status": ["ok", "ok"]})


def _verdict(s: pl.DataFrame, **kw) -> dict:
    cells = check(s, AUC, "second_half", **kw).select(
        pl.lit("m").alias("model"), pl.lit("d").alias("dataset"), pl.all()
    )
    return family(cells, schema_defaults("pathways", "check"))[0].row(0, named=True)


def test_per_sample_means_hand_case():
    s = _samples([1.0, 0.0], [0.0, 0.5], [-40.0, -10.0], [0.0, -2.0])
    t = per_sample_means(s, "target")
    assert t["flip_rate"].to_list() == [100.0, 0.0] and t["delta_p"].to_list() == [-30.0, -7.5]
    assert per_sample_means(s, "target", 2, 2)["delta_p"].to_list() == [-40.0, -10.0]  # the layer range
    c = per_sample_means(s, "control")
    assert c["flip_rate"].to_list() == [0.0, 50.0]


def test_check_verdicts_on_hand_cases():
    n = 40
    # E_Q lowers p hard in half the samples; the control barely: holds (ΔP, the primary measure)
    s = _samples([1.0, 0.0] * (n // 2), [0.0] * n, [-60.0, -5.0] * (n // 2), [-1.0, 0.0] * (n // 2))
    row = _verdict(s)
    assert row["verdict"] == HOLDS and row["n_samples"] == n and row["diff_high"] < 0
    assert row["layers"] == "second_half (2-2)" and row["diff"] == -32.0
    assert row["flip_target"] == 50.0 and row["flip_control"] == 0.0 and row["secondary_diff"] == 50.0
    # the same effect for E_Q and the control, sample by sample swapped (the `target: random` situation):
    # no "holds"; with n = 40 and differences of ±55 the CI is wider than ±SESOI, so inconclusive
    s = _samples(
        [1.0, 0.0] * (n // 2), [0.0, 1.0] * (n // 2), [-60.0, -5.0] * (n // 2), [-5.0, -60.0] * (n // 2)
    )
    row = _verdict(s)
    assert row["verdict"] == INCONCLUSIVE and row["mde"] > 5 and row["n_needed"] > n
    # the same small effect for both: within ±SESOI, does not hold
    s = _samples([0.0] * n, [0.0] * n, [-5.0, -6.0] * (n // 2), [-5.5] * n)
    assert _verdict(s)["verdict"] == NOT_HOLD
    # too few samples: inconclusive, with the minimum stated
    s = _samples([1.0, 0.0] * 3, [0.0] * 6, [-60.0, -5.0] * 3, [0.0] * 6)
    row = _verdict(s)
    assert row["verdict"] == INCONCLUSIVE and "< minimum 20" in row["reason"]
    # no control draws, or no probe: inconclusive
    s = _samples([1.0] * n, [0.0] * n, [-60.0] * n, [0.0] * n).filter(pl.col("knockout") == "target")
    assert "control_draws = 0" in _verdict(s)["reason"]
    row = _verdict(s, probe_status="probe undefined: one class only")
    assert row["verdict"] == INCONCLUSIVE and row["reason"] == "probe undefined: one class only"


def test_random_target_is_not_reported_as_holding(pristine_run, tmp_path):
    """The negative control of the whole analysis, on a real model: knocking out random question tokens
    instead of E_Q must not give 'holds'. In a copy of the shared run: the knockout and what follows rerun."""
    cfg = checkout_config()
    cfg["models"] = {"smollm2-135m": cfg["models"]["smollm2-135m"]}
    cfg["pathways"]["models"] = ["smollm2-135m"]
    cfg["pathways"]["knockout"] = {"target": "random"}
    cfg["pathways"]["check"] = {"min_samples": 10}
    cfg["depth"] = {"models": []}
    cfg["figures"] = {"pathways": [["smollm2-135m"]], "depth": []}
    work = copy_run(pristine_run, tmp_path)
    write_config(work, cfg)
    # the check table only: the experiments, the figures and the report are not rebuilt; the comparison with
    # the papers is made from it in-process, as compare_published makes it
    proc = snakemake(work, "results/demo/tables/pathways_check.tsv")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "rule generate_answers:" not in proc.stdout + proc.stderr  # the answers are the shared run's
    assert "rule extract_experiments:" not in proc.stdout + proc.stderr
    table = pl.read_csv(work / "results" / "demo" / "tables" / "pathways_check.tsv", separator="\t")
    assert table.height == 2
    assert HOLDS not in table["verdict"].to_list(), table
    assert (table["n_samples"] >= 10).all()  # a real comparison was made, not only 'inconclusive'
    published = validate.read_tsv(
        REPO / "workflow" / "report" / "published.tsv", ["kind", "model", "published"]
    )
    compared = compare(published, {"check": table}).filter(
        pl.col("check") == "E_Q knockout beats random control"
    )
    assert compared.height == 2 and HOLDS not in compared["verdict"].to_list()
    assert np.isfinite(table["flip_target"].to_numpy()).all()
