"""Controls for the falsification check's statistics (truthflow.pathways.check; docs/method.md A7): on
synthetic per-sample differences with a planted effect of known size, 1,000 seeded simulations at a time
through the same vectorised code that decides a run. Power: at the n the calculation gives for 80%, "holds"
comes out 80% ± 5% of the time; no effect at a large n: "does not hold"; a small n: "inconclusive"; no
effect in 8 cells: the family-wise false-positive rate stays at or below 5%. A probe with nothing to flip
(one class nearly everywhere) is "inconclusive", not "does not hold"."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from truthflow.config import schema_defaults
from truthflow.pathways.check import (
    HOLDS,
    INCONCLUSIVE,
    NOT_HOLD,
    check,
    decide,
    dropped_table,
    family,
    holm,
    layer_ranges,
    mde,
    n_needed,
    power,
    rounded,
    verdicts,
)

SIMS, ALPHA, SESOI, SD = 1000, 0.05, 5.0, 10.0


def _cfg(**given) -> dict:
    """pathways.check as the workflow fills it."""
    return schema_defaults("pathways", "check", given=given)


def _simulate(effect: float, n: int, cells: int = 1, seed: int = 0, sign: int = -1, sd: float = SD) -> dict:
    """SIMS runs of `cells` cells, n per-sample ΔP differences each with true mean sign·effect: the verdicts
    over each run's cells (Holm within a run)."""
    d = np.random.default_rng(seed).normal(sign * effect, sd, size=(SIMS, cells, n))
    return verdicts(d.mean(-1), d.std(-1, ddof=1), n, sign, SESOI, ALPHA)


def test_holds_in_80_percent_at_the_n_the_power_calculation_gives():
    effect = 4.0
    n = n_needed(effect, SD, ALPHA)
    assert 0.8 <= power(effect, SD, n, ALPHA) < 0.83 and power(effect, SD, n - 1, ALPHA) < 0.8
    rate = (_simulate(effect, n)["verdict"] == HOLDS).mean()
    assert abs(rate - 0.8) <= 0.05, (n, rate)
    # the other way round: the minimum detectable effect at a given n is detected 80% of the time
    n = 60
    rate = (_simulate(mde(SD, n, ALPHA), n, seed=1)["verdict"] == HOLDS).mean()
    assert abs(rate - 0.8) <= 0.05, rate
    # the flip-rate direction: E_Q flips more (diff > 0) is the predicted one
    rate = (_simulate(mde(SD, n, ALPHA), n, seed=2, sign=1)["verdict"] == HOLDS).mean()
    assert abs(rate - 0.8) <= 0.05, rate


def test_no_effect_at_a_large_n_does_not_hold_and_at_a_small_n_is_inconclusive():
    out = _simulate(0.0, 2000)
    # one-sided at α: "holds" in about 5% of the runs (the false positives), "does not hold" in the rest
    assert (out["verdict"] == NOT_HOLD).mean() >= 0.93 and (out["verdict"] != INCONCLUSIVE).all()
    assert ((out["low"] > -SESOI) & (out["high"] < SESOI)).all()  # by equivalence
    out = _simulate(0.0, 25, sd=25.0)  # the CI's half-width, about 8.5, is wider than SESOI
    assert (out["verdict"] == INCONCLUSIVE).mean() >= 0.85


def test_family_wise_false_positive_rate_over_8_cells_stays_at_5_percent():
    bound = ALPHA + 2 * np.sqrt(ALPHA * (1 - ALPHA) / SIMS)  # 5% within two binomial standard errors
    out = _simulate(0.0, 70, cells=8, seed=3)
    any_hold = (out["verdict"] == HOLDS).any(-1).mean()
    assert any_hold <= bound, any_hold
    # without the correction, 8 cells would say "holds" somewhere in about 1 − 0.95⁸ = 34% of the runs
    per_cell = (out["p"] <= ALPHA).any(-1).mean()
    assert per_cell > 0.25, per_cell
    # "holds" exactly when Holm's adjusted p is at most α: the corrected bound and p_holm agree
    assert np.array_equal(out["verdict"] == HOLDS, out["p_holm"] <= ALPHA)
    # skewed data like ΔP under the null (a few large drops, E_Q and control exchangeable, the control
    # averaged over 3 draws): the one-sided test in the predicted direction stays conservative
    rng = np.random.default_rng(4)
    drops = -rng.exponential(10, size=(4, SIMS, 8, 70)) * (rng.random((4, SIMS, 8, 70)) < 0.2)
    d = drops[0] - drops[1:].mean(0)
    skewed = verdicts(d.mean(-1), d.std(-1, ddof=1), 70, -1, SESOI, ALPHA)
    assert (skewed["verdict"] == HOLDS).any(-1).mean() <= bound


def test_holm_hand_case():
    p_holm, level = holm([0.01, 0.04, 0.03, np.nan], 0.05)
    assert np.allclose(p_holm[:3], [0.03, 0.06, 0.06]) and np.isnan(p_holm[3])
    # step 1 rejects at 0.05/3; step 2 stops at 0.05/2: the rest are tested at the level where it stopped
    assert np.allclose(level[:3], [0.05 / 3, 0.025, 0.025]) and np.isnan(level[3])


def test_decide_hand_cases():
    # ΔP: E_Q predicted below the control, so "holds" needs the upper bound below 0
    low, high = np.array([-9.0, -3.0, 1.0, -7.0, -0.5]), np.array([-1.0, 2.0, 3.0, 2.0, 0.5])
    assert decide(low, high, -1, 5.0).tolist() == [HOLDS, NOT_HOLD, NOT_HOLD, INCONCLUSIVE, NOT_HOLD]
    # flip rate: predicted above; the wrong way with 0 excluded is "does not hold" whatever its size
    assert decide([1.0, -30.0, -2.0], [9.0, -20.0, 6.0], 1, 5.0).tolist() == [HOLDS, NOT_HOLD, INCONCLUSIVE]


def test_layer_ranges():
    assert layer_ranges(30, "second_half") == [
        ("all", 1, 30),
        ("second_half", 16, 30),
        ("middle_third", 11, 20),
    ]
    assert layer_ranges(18, "all")[1:] == [("second_half", 10, 18), ("middle_third", 7, 12)]
    assert layer_ranges(30, [5, 40])[2] == ("explicit", 5, 30)  # cut to the model's layers


def _samples(
    n: int, effect: float, n_correct: int, layers: int = 12, flip: float = 0.0, seed: int = 0, sd: float = SD
) -> pl.DataFrame:
    """run_probes' per-sample table: per sample and layer, ΔP and flip rate under E_Q and the control."""
    rng = np.random.default_rng(seed)
    shape = (n, layers)
    frames = []
    for knockout, shift in (("target", effect), ("control", 0.0)):
        frames.append(
            pl.DataFrame(
                {
                    "id": np.repeat([f"s{i}" for i in range(n)], layers),
                    "layer": np.tile(np.arange(1, layers + 1), n),
                    "knockout": knockout,
                    "label": np.repeat(np.arange(n) < n_correct, layers),
                    "matched": True,
                    "delta_p": rng.normal(-shift, sd, shape).ravel(),
                    "flip_rate": (rng.random(shape) < flip).astype(float).ravel(),
                }
            )
        )
    return pl.concat(frames)


def _auc(value: float, layers: int = 12) -> pl.DataFrame:
    return pl.DataFrame({"layer": range(1, layers + 1), "auc": [value] * layers, "status": ["ok"] * layers})


def _cells(specs, layers="second_half") -> pl.DataFrame:
    return pl.concat(
        [
            check(s, a, layers).select(pl.lit("m").alias("model"), pl.lit(ds).alias("dataset"), pl.all())
            for ds, s, a in specs
        ]
    )


def test_table_columns_and_verdict_invariants():
    table, sens = family(
        _cells(
            [
                ("effect", _samples(80, 12.0, 40), _auc(0.8)),
                ("none", _samples(400, 0.0, 200, seed=1), _auc(0.8)),
                ("few", _samples(24, 0.0, 12, seed=2, sd=40.0), _auc(0.8)),
                ("no probe signal", _samples(80, 12.0, 40, seed=3), _auc(0.55)),
                ("too few", _samples(12, 12.0, 6, seed=4), _auc(0.8)),
            ]
        ),
        _cfg(),
    )
    fixed = ["measure", "layers", "diff", "diff_low", "diff_high", "p_value", "p_holm", "sesoi", "mde"]
    assert set(fixed + ["n_needed", "verdict"]) <= set(table.columns)
    v = dict(zip(table["dataset"], table["verdict"], strict=True))
    assert v == {
        "effect": HOLDS,
        "none": NOT_HOLD,
        "few": INCONCLUSIVE,
        "no probe signal": INCONCLUSIVE,
        "too few": INCONCLUSIVE,
    }
    assert set(table["measure"]) == {"delta_p"} and set(table["layers"]) == {"second_half (7-12)"}
    for r in table.iter_rows(named=True):
        if r["verdict"] == HOLDS:
            assert r["diff_high"] < 0 and r["p_holm"] <= ALPHA  # ΔP: E_Q below the control
        elif r["verdict"] == NOT_HOLD:
            assert -SESOI < r["diff_low"] and r["diff_high"] < SESOI or r["diff_low"] > 0
        else:
            assert (
                r["mde"] > 0
                and r["n_needed"] > r["n_samples"]
                or "signal" in r["reason"]
                or "<" in r["reason"]
            )
    reasons = dict(zip(table["dataset"], table["reason"], strict=True))
    assert "probe AUC 0.55" in reasons["no probe signal"] and "< minimum 20" in reasons["too few"]
    assert table.filter(pl.col("dataset") == "few")["n_needed"][0] > 24
    # Holm counts the tested cells only (3 here); the untested ones have no p_holm
    assert table["p_holm"].null_count() == 2
    # the sensitivity table: the primary measure under each of the three layer ranges
    assert sens.height == 15 and set(sens["range"]) == {"all", "second_half", "middle_third"}
    # the secondary measure is reported, uncorrected
    assert set(table["secondary_measure"]) == {"flip_rate"}


def test_a_probe_with_nothing_to_flip_is_inconclusive():
    """A model that answers ~5% correctly: the probe calls nearly every sample wrong, ~0.1% of predictions
    flip under either knockout and ΔP barely moves. Without the signal gate that would read "does not hold"
    (a CI well within ±SESOI); it describes the probe, not the pathway."""
    s = _samples(400, 0.0, 20, flip=0.0015).with_columns(pl.col("delta_p") / 20)
    cells = _cells([("one class", s, _auc(0.85))])
    ungated, _ = family(cells, _cfg(min_minority=2, min_minority_share=0.0))
    assert ungated["verdict"][0] == NOT_HOLD
    table, _ = family(cells, _cfg())
    assert table["verdict"][0] == INCONCLUSIVE
    assert "minority class has 20 of 400" in table["reason"][0] and "too little signal" in table["reason"][0]


@pytest.mark.parametrize("measure", ["delta_p", "flip_rate"])
def test_measure_key_picks_the_primary(measure):
    s = _samples(80, 12.0, 40, flip=0.2)
    table, _ = family(_cells([("x", s, _auc(0.8))], [3, 6]), _cfg(measure=measure, layers=[3, 6]))
    assert table["measure"][0] == measure and table["layers"][0] == "explicit (3-6)"
    assert table["secondary_measure"][0] != measure


def test_dropped_table_counts_every_sample_once():
    kept = [("m1", "nq", 7), ("m2", "nq", 0)]
    dropped = pl.DataFrame(
        {"model": ["m1", "m1", "m1"], "dataset": ["nq"] * 3, "reason": ["no E_A", "no E_A", "x"]}
    )
    loading = pl.DataFrame({"dataset": ["nq", "nq"], "reason": ["repeated id"] * 2, "detail": [None, "id 3"]})
    t = dropped_table(kept, dropped, loading)
    assert t.columns == ["model", "dataset", "reason", "n", "detail"] and t["n"].dtype == pl.UInt32
    assert t.rows() == [
        ("(loading, all models)", "nq", "repeated id", 2, "id 3"),
        ("m1", "nq", "kept", 7, None),
        ("m1", "nq", "no E_A", 2, None),
        ("m1", "nq", "x", 1, None),
        ("m2", "nq", "kept", 0, None),
    ]
    assert dropped_table([], dropped.clear(), loading.clear()).height == 0


def test_rounded_keeps_p_values_significant():
    t = pl.DataFrame({"diff": [1.23456], "p_holm": [0.000123456], "n_samples": [3]})
    assert rounded(t).row(0) == (1.23, 0.000123, 3)
