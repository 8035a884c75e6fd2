"""The falsification test of the pathways finding (E_Q knockout vs a matched random control): the matched
control draw, the verdict on hand-computed cases, and the negative control run on a real model — with
`pathways.knockout.target: random` the check must not say "holds"."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from conftest import new_workdir, small_config, snakemake

from truthflow.pathways.check import HOLDS, INCONCLUSIVE, NOT_HOLD, check, per_sample_means, verdict
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
                        "matched": True,
                        "flip_rate": f,
                        "delta_p": d,
                    }
                )
    return pl.DataFrame(rows)


def test_per_sample_means_hand_case():
    s = _samples([1.0, 0.0], [0.0, 0.5], [-40.0, -10.0], [0.0, -2.0])
    t = per_sample_means(s, "target")
    assert t["flip"].to_list() == [100.0, 0.0] and t["delta_p"].to_list() == [-40.0, -10.0]
    c = per_sample_means(s, "control")
    assert c["flip"].to_list() == [0.0, 50.0]


def test_verdict_holds_only_with_cis_apart():
    n = 40
    # E_Q flips half the samples hard; the control flips none: holds
    s = _samples([1.0, 0.0] * (n // 2), [0.0] * n, [-60.0, -5.0] * (n // 2), [-1.0, 0.0] * (n // 2))
    row = check(s, min_samples=20, n_boot=300, seed=0)
    assert row["verdict"] == HOLDS and row["n_samples"] == n
    assert row["flip_target"] == 50.0 and row["flip_control"] == 0.0 and row["flip_diff"] == 50.0
    assert row["flip_target_low"] > row["flip_control_high"]
    # the same effect for E_Q and the control (the `target: random` situation): does not hold
    s = _samples(
        [1.0, 0.0] * (n // 2), [0.0, 1.0] * (n // 2), [-60.0, -5.0] * (n // 2), [-5.0, -60.0] * (n // 2)
    )
    assert check(s, 20, 300, 0)["verdict"] == NOT_HOLD
    # flips apart but ΔP not: does not hold (both measures must agree)
    s = _samples([1.0, 0.0] * (n // 2), [0.0] * n, [-5.0] * n, [-5.0] * n)
    row = check(s, 20, 300, 0)
    assert row["verdict"] == NOT_HOLD and "ΔP" in row["reason"]
    # too few samples: inconclusive, with the minimum stated
    s = _samples([1.0, 0.0] * 3, [0.0] * 6, [-60.0, -5.0] * 3, [0.0] * 6)
    row = check(s, 20, 300, 0)
    assert row["verdict"] == INCONCLUSIVE and "< minimum 20" in row["reason"]
    # no control draws, or no probe: inconclusive
    s = _samples([1.0] * n, [0.0] * n, [-60.0] * n, [0.0] * n).filter(pl.col("knockout") == "target")
    assert check(s, 20, 300, 0)["verdict"] == INCONCLUSIVE
    assert check(s, 20, 300, 0, probe_status="probe undefined: one class only")["verdict"] == INCONCLUSIVE


def test_verdict_function_on_hand_row():
    row = {
        "n_samples": 30,
        "min_samples": 20,
        "flip_target_low": 5.0,
        "flip_control_high": 4.9,
        "delta_p_target_high": -3.0,
        "delta_p_control_low": -2.0,
    }
    assert verdict(row)[0] == HOLDS
    assert verdict({**row, "flip_target_low": 4.9})[0] == NOT_HOLD  # touching CIs are not apart


@pytest.mark.slow
def test_random_target_is_not_reported_as_holding(tmp_path, demo_models_root):
    """The negative control of the whole analysis, on a real model: knocking out random question tokens
    instead of E_Q must not give 'holds'."""
    cfg = small_config()
    for name in ("popqa", "nq"):
        cfg["datasets"][name]["n"] = 60
    cfg["datasets"] = {k: v for k, v in cfg["datasets"].items() if k in ("popqa", "nq")}
    cfg["models"] = {"smollm2-135m": cfg["models"]["smollm2-135m"]}
    cfg["pathways"].update(models=["smollm2-135m"], datasets=["popqa", "nq"])
    cfg["pathways"]["knockout"] = {"target": "random"}
    cfg["pathways"]["check"] = {"min_samples": 10}
    cfg["depth"] = {"models": []}
    cfg["figures"] = {"pathways": [["smollm2-135m"]], "depth": []}
    work = new_workdir(tmp_path, demo_models_root, cfg)
    proc = snakemake(work)
    assert proc.returncode == 0, proc.stderr[-4000:]
    table = pl.read_csv(work / "results" / "demo" / "tables" / "pathways_check.tsv", separator="\t")
    assert table.height == 2
    assert HOLDS not in table["verdict"].to_list(), table
    assert (table["n_samples"] >= 10).all()  # a real comparison was made, not only 'inconclusive'
    compare = pl.read_csv(
        work / "results" / "demo" / "tables" / "published_vs_reproduced.tsv", separator="\t"
    ).filter(pl.col("check") == "E_Q knockout beats random control")
    assert compare.height == 2 and HOLDS not in compare["verdict"].to_list()
    assert np.isfinite(table["flip_target"].to_numpy()).all()
