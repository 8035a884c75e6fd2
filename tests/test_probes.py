import numpy as np
import polars as pl
import pytest

from truthflow.pathways.probes import (
    anchors,
    auc_by_layer,
    crossfit,
    crossfit_seeds,
    fit_predict,
    folds,
    knockout_effect,
    run_probes,
    split_reason,
    summarize,
)
from truthflow.stats import MIN_CI_N, bootstrap_ci, wilson_ci

PROBE = {"seeds": [0], "test_size": 0.2, "C": 1.0, "max_iter": 2000}  # pathways.probe


def test_delta_p_hand_case():
    # p = 0.8 -> p_ko = 0.6: 100·(0.6-0.8)/0.8 = -25; p = 0.5 -> 0.75: +50; P(correct) 0.2 predicts 'wrong'
    # with p = 0.8, and 0.4 leaves it p_ko = 0.6: -25; 0.3 -> 0.7 flips it: 100·(0.3-0.7)/0.7
    p, dp, flipped = knockout_effect(np.array([0.8, 0.5, 0.2, 0.3]), np.array([0.6, 0.75, 0.4, 0.7]))
    assert np.allclose(p, [0.8, 0.5, 0.8, 0.7]) and np.allclose(dp, [-25.0, 50.0, -25.0, -400 / 7])
    assert flipped.tolist() == [False, False, False, True]


def test_anchor_split_per_layer_and_fixed():
    # flip rates over seeds: Q-Anchored only where more than half of the seeds flip
    flip_rate = np.array([[0.0, 2 / 3, 1.0], [1 / 3, 0.5, 1.0]])
    assert anchors(flip_rate).tolist() == [
        ["A-Anchored", "Q-Anchored", "Q-Anchored"],
        ["A-Anchored", "A-Anchored", "Q-Anchored"],
    ]
    assert anchors(flip_rate, "fixed_layer", 2).tolist() == [["Q-Anchored"] * 3, ["A-Anchored"] * 3]
    with pytest.raises(ValueError):
        anchors(flip_rate, "fixed_layer", 4)


def test_bootstrap_is_seeded_and_sane():
    vals = np.arange(20, dtype=float)
    a, b = bootstrap_ci(vals, 500, 7), bootstrap_ci(vals, 500, 7)
    assert a == b and a[0] < vals.mean() < a[1]
    assert bootstrap_ci(vals, 500, 8) != a
    # one value has no CI: never a zero-width band
    assert all(np.isnan(bootstrap_ci(np.array([3.0]), 100, 0)))


def test_summarize_hand_case_counts_distinct_samples():
    df = pl.DataFrame(
        {
            "id": ["a", "b", "c", "a", "b", "c"],
            "knockout": ["target"] * 3 + ["control"] * 3,
            "matched": [True, True, False] * 2,
            "anchor": ["Q-Anchored", "Q-Anchored", "A-Anchored"] * 2,
            "layer": [1] * 6,
            "delta_p": [-10.0, -30.0, 2.0, -1.0, 1.0, 5.0],
            "flip_rate": [1.0, 1.0, 0.0, 0.0, 0.0, 0.0],
        }
    )
    s = summarize(df, n_boot=200, seed=0)
    row = {(r["knockout"], r["anchor"]): r for r in s.iter_rows(named=True)}
    q = row[("target", "Q-Anchored")]
    # two samples: a mean, but no CI (a bootstrap over 2 values has 3 possible means)
    assert q["n"] == 2 and q["mean_delta_p"] == -20.0 and np.isnan(q["ci_low"]) and np.isnan(q["ci_high"])
    assert q["flip_rate"] == 1.0
    # the unmatched sample c is in the target split but not in the control or the unsplit rows
    assert row[("target", "A-Anchored")]["n"] == 1 and np.isnan(row[("target", "A-Anchored")]["ci_low"])
    assert ("control", "A-Anchored") not in row
    assert row[("target", "all")]["n"] == 2 and row[("target", "all")]["mean_delta_p"] == -20.0
    assert row[("control", "all")]["mean_delta_p"] == 0.0


def test_probes_on_separable_data_and_knockout():
    rng = np.random.default_rng(0)
    n, layers, d = 60, 3, 5
    labels = np.array([0, 1] * (n // 2))
    clean = rng.normal(size=(n, layers, d)).astype(np.float16)
    clean[:, :, 0] += labels[:, None] * 6 - 3  # class signal in feature 0
    ko = clean.copy()
    ko[:, 2, 0] = 0.0  # the knockout erases the signal at layer 3 only
    control = clean.copy()  # a control that changes nothing
    auc, samples = run_probes(
        clean,
        [ko, control],
        labels,
        [f"s{i}" for i in range(n)],
        {**PROBE, "seeds": [0, 1], "test_size": 0.25},
    )
    assert auc.height == 2 * layers and (auc["auc"] > 0.95).all() and (auc["n_folds"] == 4).all()
    # cross-fitted: every sample once per layer and knockout condition, seeds averaged
    assert samples.height == 2 * n * layers and (samples["n_seeds"] == 2).all()
    assert samples.filter(pl.col("knockout") == "target")["id"].n_unique() == n
    target = samples.filter(pl.col("knockout") == "target")
    by_layer = target.group_by("layer").agg(pl.col("delta_p").mean()).sort("layer")["delta_p"].to_list()
    assert abs(by_layer[0]) < 1e-6 and by_layer[2] < -10
    ctrl = samples.filter(pl.col("knockout") == "control")
    assert ctrl["delta_p"].abs().max() < 1e-9 and ctrl["flip_rate"].max() == 0.0


def test_one_class_labels_give_probe_undefined_row():
    assert split_reason(np.ones(10), 5) == "one class only (10 correct, 0 wrong)"
    assert "too few" in split_reason(np.array([1] * 9 + [0]), 5)
    assert split_reason(np.array([1, 1, 1, 0, 0, 0]), 5).startswith(
        "fewer samples per class than the 5 folds"
    )
    assert split_reason(np.array([1, 1, 0, 0]), 2, "Q", "A") is None
    auc, samples = run_probes(
        np.zeros((10, 2, 3)),
        [np.zeros((10, 2, 3))],
        np.ones(10, dtype=int),
        [str(i) for i in range(10)],
        PROBE,
    )
    assert auc.height == 1 and auc["status"][0].startswith("probe undefined: one class")
    assert samples.height == 0


def test_bootstrap_ci_needs_min_ci_n_samples():
    assert MIN_CI_N == 5
    assert all(np.isnan(bootstrap_ci(np.zeros(k), 100, 0)).all() for k in range(MIN_CI_N))
    lo, hi = bootstrap_ci(np.array([0.0, 0.0, 0.0, 0.0, 10.0]), 2000, 0)
    # resampled means lie in {0, 2, ..., 10}; P(mean = 0) = 0.8^5 = 0.33 > 2.5%: the lower bound is 0;
    # P(mean >= 6) = P(3+ tens) = 0.058 > 2.5%, P(mean >= 8) = 0.0067 < 2.5%: the upper bound is 6
    assert lo == 0.0 and hi == 6.0
    assert bootstrap_ci(np.full(5, 3.0), 100, 0) == (3.0, 3.0)  # no spread: the CI is the value itself


def test_wilson_ci_hand_cases():
    # 0 of 12: centre = half = (z^2 / 2n) / (1 + z^2 / n) = 0.16007 / 1.32013 = 0.12125 -> [0, 0.2425]
    assert wilson_ci(np.zeros(12)) == (0.0, pytest.approx(0.24249, abs=1e-5))
    # 1 of 5: centre (0.2 + 0.38415) / 1.76829 = 0.33035, half 1.10840 * sqrt(0.032 + 0.038415) = 0.29412
    lo, hi = wilson_ci(np.array([1.0, 0, 0, 0, 0]))
    assert lo == pytest.approx(0.03622, abs=1e-5) and hi == pytest.approx(0.62447, abs=1e-5)
    assert wilson_ci(np.ones(8))[1] == 1.0 and wilson_ci(np.ones(8))[0] == pytest.approx(0.67559, abs=1e-5)
    assert all(np.isnan(wilson_ci(np.zeros(4))))  # fewer than MIN_CI_N samples: no CI
    with pytest.raises(ValueError):
        wilson_ci(np.array([0.0, 0, 0, 0, 2.0]))


def test_crossfit_is_the_hand_written_k_fold():
    """Every row is scored once, by the probe of the one fold that held it out; the other states of the same
    rows get that probe too; crossfit_seeds stacks [states, seeds, N]."""
    rng = np.random.default_rng(1)
    y = np.array([0, 1] * 15)
    x = rng.normal(size=(30, 3)) + y[:, None]
    other = rng.normal(size=(30, 3))
    want, want_other = np.zeros(30), np.zeros(30)
    splits = folds(y, 3, 7)
    assert sorted(np.concatenate([t for _, t in splits]).tolist()) == list(range(30))
    for train, test in splits:
        want[test], want_other[test] = fit_predict(x[train], y[train], [x[test], other[test]], 1.0, 100)
    got, got_other = crossfit(x, y, 7, 3, 1.0, 100, [other])
    assert np.array_equal(got, want) and np.array_equal(got_other, want_other)
    stacked = crossfit_seeds(x, [other], y, [7, 8], 3, 1.0, 100)
    assert stacked.shape == (2, 2, 30) and np.array_equal(stacked[1, 0], want_other)
    assert not np.array_equal(stacked[0, 1], want)  # another seed, another split


def test_auc_by_layer_summarises_the_seeds():
    auc = pl.DataFrame(
        {
            "model": ["m"] * 4,
            "dataset": ["d"] * 4,
            "seed": [0, 1, 0, 1],
            "layer": [2, 2, 1, 1],
            "auc": [0.7, 0.8, 0.5, 0.6],
            "n_test": [10] * 4,
            "status": ["ok"] * 4,
        }
    )
    t = auc_by_layer(auc)
    assert t["layer"].to_list() == [1, 2] and t["mean_auc"].to_list() == [0.55, 0.75]
    assert t["min_auc"].to_list() == [0.5, 0.7] and t["n_seeds"].to_list() == [2, 2]


@pytest.mark.parametrize("compute", ["float32", "bfloat16"])
def test_probes_in_worker_processes_equal_one_process(tmp_path, compute):
    """Layers fitted side by side in worker processes, from memory-mapped layer-major files as probe_deltap
    reads them (a bf16 model's as bit patterns, converted a layer at a time), give the very probabilities of
    the one-process loop."""
    from truthflow.pathways import activations

    rng = np.random.default_rng(1)
    n, layers, d = 40, 3, 6
    labels = np.array([0, 1] * (n // 2))
    paths = {name: str(tmp_path / f"{name}.npy") for name in activations.RESID}
    with activations.written(paths, activations.resid_shapes(n, layers, d, 1), compute) as resid:
        clean, (ko, control) = activations.knockout_out(*resid)
        values = rng.normal(size=(n, layers, d))
        values[:, :, 0] += labels[:, None] * 2 - 1
        clean[:] = values
        ko[:] = rng.normal(size=(n, layers, d))
        control[:] = values
    states = activations.read_resid(paths, n, "samples.parquet")
    kos, ids = [states[1], *states[2]], [f"s{i}" for i in range(n)]
    probe = {**PROBE, "seeds": [0, 1]}
    auc_one, samples_one = run_probes(states[0], kos, labels, ids, probe, workers=1)
    auc_two, samples_two = run_probes(states[0], kos, labels, ids, probe, workers=2)
    assert auc_one.equals(auc_two) and samples_one.equals(samples_two)
    assert samples_one.filter(pl.col("knockout") == "target")["delta_p"].abs().max() > 1  # not all zero
