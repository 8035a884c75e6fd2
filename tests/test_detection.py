import numpy as np
import polars as pl
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import StandardScaler

from truthflow.pathways.detection import (
    awareness_auc,
    awareness_summary,
    detection_summary,
    detection_table,
    gate_probs,
    mop_predict,
    pr_select_and_predict,
    pr_states,
    random_gate,
    table3,
    vanilla_split,
)

PROBE = {"seeds": [0, 1], "test_size": 0.2, "C": 1.0, "max_iter": 2000}


def _hand_probe(x_train, y_train, x_test, C=1.0, max_iter=2000):
    """The probe of probes.py written out independently: StandardScaler + LogisticRegression."""
    scaler = StandardScaler().fit(x_train)
    clf = LogisticRegression(C=C, max_iter=max_iter).fit(scaler.transform(x_train), y_train)
    return clf.predict_proba(scaler.transform(x_test))[:, 1]


def _gated_data(n=40, d=3, seed=0):
    """Groups alternate Q/A and are carried by feature 0 (±3): the gate is perfectly separable."""
    rng = np.random.default_rng(seed)
    g = np.arange(n) % 2 == 0
    x = rng.normal(size=(n, d)).astype(np.float32)
    x[:, 0] += np.where(g, 3.0, -3.0)
    return x, g


# ------------------------------------------------------------------------------------------------- MoP


def test_mop_gate_routing_hand_case():
    x, g = _gated_data()
    train, test = np.arange(30), np.arange(30, 40)
    w = _hand_probe(x[train], g[train], x[test])
    assert np.all((w > 0.5) == g[test])  # the gate is perfect here
    assert np.allclose(gate_probs(x, g, train, test)[0], w)
    # Q-Anchored all correct, A-Anchored all wrong: the experts train on one class each and predict the
    # constants a = 1, b = 0, so the mixture is w·1 + (1 − w)·0
    y = g.astype(int)
    assert np.allclose(mop_predict(x, y, g, train, test)[0], w * 1.0 + (1 - w) * 0.0)
    # the other way round: a = 0, b = 1 -> 1 − w (a swapped gate or swapped experts would give w)
    assert np.allclose(mop_predict(x, 1 - y, g, train, test)[0], w * 0.0 + (1 - w) * 1.0)


def test_random_gate_is_seeded_and_used_by_mop():
    u = random_gate(10, 3)
    assert np.array_equal(u, random_gate(10, 3)) and not np.array_equal(u, random_gate(10, 4))
    assert np.all((u >= 0) & (u < 1)) and np.unique(u).size == 10
    assert np.array_equal(random_gate(10, (3, 1)), random_gate(10, (3, 1)))
    x, g = _gated_data()
    train, test = np.arange(30), np.arange(30, 40)
    y = g.astype(int)  # constant experts a = 1 (Q), b = 0 (A)
    p = mop_predict(x, y, g, train, test, gate="random", seed=3)[0]
    assert np.allclose(p, u * 1.0 + (1 - u) * 0.0)
    assert np.array_equal(p, mop_predict(x, y, g, train, test, gate="random", seed=3)[0])


def test_vanilla_split_sizes_equal_group_sizes():
    train = np.arange(5, 35)
    q, a = vanilla_split(train, 11, seed=7)
    assert len(q) == 11 and len(a) == 19
    assert np.array_equal(np.sort(np.concatenate([q, a])), train)  # a partition of train
    assert all(np.array_equal(s, t) for s, t in zip((q, a), vanilla_split(train, 11, 7), strict=True))
    assert not np.array_equal(q, vanilla_split(train, 11, 8)[0])


def test_mop_vanilla_experts_use_the_seeded_split():
    x, g = _gated_data(n=50)
    train, test = np.arange(40), np.arange(40, 50)
    n_q = int(g[train].sum())
    q, a = vanilla_split(train, n_q, seed=5)
    assert len(q) == n_q and len(a) == len(train) - n_q
    # labels that make the *vanilla* halves one class each: their experts are the constants 1 and 0
    y = np.zeros(50, dtype=int)
    y[q] = 1
    y[test] = np.arange(10) % 2
    w = _hand_probe(x[train], g[train], x[test])  # the pathway gate still routes
    p = mop_predict(x, y, g, train, test, gate="pathway", experts="vanilla", seed=5)[0]
    assert np.allclose(p, w)
    # the pathway experts on the same labels are real probes, not the constants 1 and 0
    assert not np.allclose(mop_predict(x, y, g, train, test)[0], w)


def test_mop_fallbacks_never_crash():
    x, g = _gated_data()
    train, test = np.arange(30), np.arange(30, 40)
    y = np.arange(40) % 3 == 0
    g_all_q = np.ones(40, dtype=bool)
    # one group in train: w = 1 and the empty A expert predicts the train rate
    p = mop_predict(x, y, g_all_q, train, test)[0]
    assert np.allclose(p, _hand_probe(x[train], y[train], x[test]))
    p = mop_predict(x, y, g_all_q, train, test, gate="random", seed=0)[0]
    u = random_gate(10, 0)
    assert np.allclose(p, u * _hand_probe(x[train], y[train], x[test]) + (1 - u) * y[train].mean())
    with pytest.raises(ValueError):
        mop_predict(x, y, g, train, test, gate="oracle")[0]


# -------------------------------------------------------------------------------------------------- PR


def test_pr_routing_follows_the_gate():
    x, g = _gated_data(n=40)
    train, test = np.arange(30), np.arange(30, 40)
    g_true = g.copy()
    g_true[0] = False  # a train row whose x looks Q-Anchored: train rows use their true group (down)
    g_true[31] = True  # a test row whose x looks A-Anchored: test rows use the gate's group (down)
    ids = np.arange(40, dtype=np.float32)[:, None]
    up = np.hstack([ids, np.ones((40, 1), np.float32)])
    down = np.hstack([ids, -np.ones((40, 1), np.float32)])
    s_tr, s_te, q_te, _ = pr_states(up, down, x, g_true, train, test)
    assert np.array_equal(q_te, g[test])  # the gate reads x, not the true test groups
    assert np.array_equal(s_te[:, 1], np.where(g[test], 1, -1)) and s_te[1, 1] == -1
    assert np.array_equal(s_tr[:, 1], np.where(g_true[train], 1, -1)) and s_tr[0, 1] == -1
    assert np.array_equal(s_tr[:, 0], train) and np.array_equal(s_te[:, 0], test)


def _pr_data(n=240, d=4, seed=1):
    """Perfect gate on x_clean; x_clean carries no label signal. Factor 2 routes the label signal: it sits
    in `up` for Q-Anchored and in `down` for A-Anchored samples, so only the right routing sees it."""
    rng = np.random.default_rng(seed)
    x, g = _gated_data(n, d, seed)
    y = (rng.permutation(n) % 2).astype(int)
    signal = (2 * y - 1)[:, None] * 1.5
    noise = lambda: rng.normal(size=(n, d)).astype(np.float32)  # noqa: E731
    up2, down2 = noise(), noise()
    up2[g] += signal[g]
    down2[~g] += signal[~g]
    test = np.arange(n)[np.arange(n) % 4 == 3]
    train = np.setdiff1d(np.arange(n), test)
    return x, y, g, {2.0: (up2, down2)}, train, test, noise, signal


def test_pr_picks_the_routed_factor_and_routing_matters():
    x, y, g, states, train, test, _, _ = _pr_data()
    p, f, _ = pr_select_and_predict(states, x, y, g, train, test, [2.0], seed=0)
    assert f == 2.0 and roc_auc_score(y[test], p) > 0.9
    # swapped routing (up <-> down) hides the signal: factor 1 (plain probing) wins instead
    up2, down2 = states[2.0]
    _, f_swapped, _ = pr_select_and_predict({2.0: (down2, up2)}, x, y, g, train, test, [2.0], seed=0)
    assert f_swapped == 1.0


def test_pr_factor_is_chosen_on_validation_only():
    x, y, g, states, train, test, noise, signal = _pr_data()
    # factor 4 carries a much stronger label signal, but on the test rows only: selection on test data
    # would pick it, selection on validation data (inside train) cannot see it
    up4, down4 = noise(), noise()
    up4[test] += 5 * signal[test]
    down4[test] += 5 * signal[test]
    states = {**states, 4.0: (up4, down4)}
    p, f, _ = pr_select_and_predict(states, x, y, g, train, test, [2.0, 4.0], seed=0)
    assert f == 2.0
    # no leakage: the test labels and test groups are never read (identical output when they change),
    # and test states change the test predictions but not the chosen factor
    y2, g2 = y.copy(), g.copy()
    y2[test], g2[test] = 1 - y2[test], ~g2[test]
    p2, f2, _ = pr_select_and_predict(states, x, y2, g2, train, test, [2.0, 4.0], seed=0)
    assert f2 == f and np.array_equal(p2, p)
    shuffled = {k: (u.copy(), d.copy()) for k, (u, d) in states.items()}
    for u, d in shuffled.values():
        u[test], d[test] = noise()[test], noise()[test]
    _, f3, _ = pr_select_and_predict(shuffled, x, y, g, train, test, [2.0, 4.0], seed=0)
    assert f3 == f


def test_pr_factor_one_is_plain_probing_and_ties_go_to_the_smallest():
    x, y, g, _, train, test, noise, signal = _pr_data()
    x_info = x + signal  # now the clean states carry the signal
    plain = _hand_probe(x_info[train], y[train], x_info[test])
    p, f, _ = pr_select_and_predict({}, x_info, y, g, train, test, [1.0], seed=0)
    assert f == 1.0 and np.allclose(p, plain)
    # reweighted states that are pure noise lose to factor 1: PR falls back to plain probing exactly
    p, f, _ = pr_select_and_predict({3.0: (noise(), noise())}, x_info, y, g, train, test, [3.0], seed=0)
    assert f == 1.0 and np.allclose(p, plain)
    # identical candidates tie on validation: the smallest factor wins (1 over 2 and 4; 2 over 4)
    same = {2.0: (x_info, x_info), 4.0: (x_info, x_info)}
    assert pr_select_and_predict(same, x_info, y, g, train, test, [4.0, 2.0], seed=0)[1] == 1.0
    info = x + 2 * signal
    same = {2.0: (info, info), 4.0: (info.copy(), info.copy())}
    assert pr_select_and_predict(same, x, y, g, train, test, [4.0, 2.0], seed=0)[1] == 2.0


# ------------------------------------------------------------------------------------------- awareness


def test_awareness_auc_separable_random_and_one_group():
    rng = np.random.default_rng(0)
    n, n_layers, d = 120, 3, 5
    g = rng.permutation(n) % 2 == 0
    resid = rng.normal(size=(n, n_layers, d)).astype(np.float16)
    resid[:, 1, 0] += np.where(g, 4.0, -4.0).astype(np.float16)  # layer 2 separates the groups
    out = awareness_auc(resid, g, layers=[2], probe=PROBE)
    assert out.columns == ["layer", "seed", "auc", "n", "n_q", "n_a", "status"]
    assert out.height == 2 and (out["auc"] == 1.0).all() and (out["status"] == "ok").all()
    assert out["n_q"][0] == g.sum() and out["n_a"][0] == n - g.sum() and out["n"][0] == n
    # negative control: layers 1 and 3 are noise, and shuffled groups on layer 2 carry nothing either
    noise = awareness_auc(resid, g, layers=[1, 3], probe=PROBE)
    shuffled = awareness_auc(resid, rng.permutation(g), layers=[2], probe=PROBE)
    for t in (noise, shuffled):
        assert (t["status"] == "ok").all() and (t["auc"] < 0.7).all()
    # one group only / a layer out of range: status rows, no exception
    one = awareness_auc(resid, np.ones(n, dtype=bool), layers=[1, 3], probe={**PROBE, "seeds": [0]})
    assert one.height == 2 and one["auc"].is_null().all()
    assert one["status"][0] == f"undefined: one class only ({n} Q-Anchored, 0 A-Anchored)"
    bad = awareness_auc(resid, g, layers=[4], probe={**PROBE, "seeds": [0]})
    assert bad["status"][0] == "undefined: layer 4 not in 1..3"
    # layers fitted side by side in two worker processes: the same table, the out-of-range layer included
    assert awareness_auc(resid, g, [1, 2, 3, 4], PROBE, workers=2).equals(
        awareness_auc(resid, g, [1, 2, 3, 4], PROBE)
    )


# ------------------------------------------------------------------------------------------- Table 3


def test_detection_table_shape_baselines_and_summary():
    x, y, g, states, _, _, noise, signal = _pr_data(n=100)
    x = x + signal
    y_float = y.astype(float)
    baselines = {"P(True)": y_float, "Logits-mean": np.zeros(100), "Logits-min": noise()[:, 0]}
    t = detection_table(x, y, g, states, baselines, [2.0], PROBE)
    methods = ["P(True)", "Logits-mean", "Logits-min", "Probing", "MoP", "MoP-RandomGate"]
    methods += ["MoP-VanillaExperts", "PR"]
    assert t.columns == ["method", "seed", "auc", "n", "factor", "status"]
    assert t.height == len(methods) * 2 and t["method"].unique(maintain_order=True).to_list() == methods
    assert (t["status"] == "ok").all() and (t["n"] == 100).all()
    auc = {(r["method"], r["seed"]): r["auc"] for r in t.iter_rows(named=True)}
    assert auc[("P(True)", 0)] == 1.0 and auc[("Logits-mean", 1)] == 0.5  # score = y; constant score
    assert auc[("Probing", 0)] > 0.9 and auc[("MoP", 0)] > 0.85
    pr = t.filter(pl.col("method") == "PR")["factor"].to_list()
    assert all(len(s.split(",")) == 5 and set(s.split(",")) <= {"1", "2"} for s in pr)
    assert t.filter(pl.col("method") != "PR")["factor"].is_null().all()
    s = detection_summary(t)
    assert s.columns == ["method", "mean", "sd", "n_seeds", "n"] and s["method"].to_list() == methods
    row = {r["method"]: r for r in s.iter_rows(named=True)}
    assert row["P(True)"]["mean"] == 1.0 and row["P(True)"]["sd"] == 0.0 and row["Logits-min"]["sd"] == 0.0
    assert row["Probing"]["n_seeds"] == 2 and row["Probing"]["n"] == 100
    assert row["Probing"]["sd"] == pytest.approx(np.std([auc[("Probing", 0)], auc[("Probing", 1)]], ddof=1))


def test_detection_table_statuses_instead_of_exceptions():
    x, y, g, states, _, _, noise, _ = _pr_data(n=60)
    base = {"P(True)": noise()[:, 0]}
    one = detection_table(x, np.ones(60, dtype=int), g, states, base, [2.0], {**PROBE, "seeds": [0]})
    assert one.height == 6 and one["auc"].is_null().all()
    assert (
        one.filter(pl.col("method") == "Probing")["status"][0]
        == "undefined: one class only (60 correct, 0 wrong)"
    )
    # missing reweighted states: PR says so, the other methods still run
    miss = detection_table(x, y, g, states, base, [4.0], {**PROBE, "seeds": [0]})
    pr = miss.filter(pl.col("method") == "PR")
    assert pr["auc"].is_null().all() and "no reweighted states for factor 4" in pr["status"][0]
    assert miss.filter(pl.col("method") != "PR")["auc"].is_not_null().all()
    # one group only: MoP runs on its fallbacks and says so in its status
    mop = detection_table(x, y, np.ones(60, dtype=bool), states, base, [2.0], {**PROBE, "seeds": [0]})
    st = mop.filter(pl.col("method") == "MoP")["status"][0]
    assert st.startswith("ok (fallback:") and "expert A: no training samples" in st


def test_detection_table_pr_without_factors_is_probing_on_the_same_split():
    # factor 1 only: PR is plain probing, fold for fold, so its AUC equals Probing's only if both methods
    # see the same StratifiedKFold split of each seed
    x, y, g, _, _, _, _, signal = _pr_data(n=80)
    x = x + 0.5 * signal
    t = detection_table(x, y, g, None, {}, [], {**PROBE, "seeds": [0, 3], "test_size": 0.5})  # K = 2 folds
    for seed in (0, 3):
        rows = {r["method"]: r for r in t.filter(pl.col("seed") == seed).iter_rows(named=True)}
        assert rows["PR"]["factor"] == "1,1"
        assert rows["PR"]["auc"] == rows["Probing"]["auc"]
    a0, a3 = t.filter(pl.col("method") == "Probing")["auc"].to_list()
    assert a0 != a3  # the seed changes the split


def test_awareness_needs_every_fold_to_hold_both_groups():
    rng = np.random.default_rng(0)
    resid = rng.normal(size=(100, 2, 4)).astype(np.float32)
    groups = np.zeros(100, dtype=bool)
    groups[:3] = True  # 3 Q-Anchored: fewer than the 5 folds
    t = awareness_auc(resid, groups, [1, 2], {**PROBE, "seeds": [0]})
    assert t["auc"].null_count() == t.height
    want = "undefined: fewer samples in a group than the 5 folds (3 Q-Anchored, 97 A-Anchored)"
    assert t["status"][0] == want


def test_table3_layout_order_and_undefined_cells():
    rows = []
    for model, ds, aucs in (("m1", "nq", [0.8, 0.9]), ("m1", "popqa", [0.7, 0.7]), ("m2", "zz", [0.6, None])):
        for seed, auc in enumerate(aucs):
            status = "ok" if auc is not None else "undefined: one class"
            rows.append(
                {"model": model, "dataset": ds, "method": "Probing", "seed": seed, "auc": auc, "n": 9}
            )
            rows[-1]["status"] = status
    rows.append(
        {
            "model": "m2",
            "dataset": "nq",
            "method": "PR",
            "seed": 0,
            "auc": None,
            "n": 9,
            "status": "undefined",
        }
    )
    t = table3(pl.DataFrame(rows), {"popqa": "PopQA", "nq": "NQ"})
    assert t.columns == ["model", "method", "PopQA", "NQ", "zz"]  # display order, then the others
    cell = {(r["model"], r["method"]): r for r in t.iter_rows(named=True)}
    assert cell[("m1", "Probing")]["NQ"] == f"85.00 ± {100 * np.std([0.8, 0.9], ddof=1):.2f}"
    assert cell[("m1", "Probing")]["PopQA"] == "70.00 ± 0.00" and cell[("m1", "Probing")]["zz"] == "–"
    assert cell[("m2", "Probing")]["zz"] == "60.00"  # one ok seed: no sd
    assert cell[("m2", "PR")]["NQ"] == "–" and cell[("m1", "PR")]["PopQA"] == "–"  # no ok seed / no rows
    assert table3(pl.DataFrame(rows).clear(), {}).columns == ["model", "method"]


def test_awareness_summary_over_seeds_with_an_auc():
    aware = pl.DataFrame(
        {
            "model": ["m"] * 4,
            "dataset": ["d"] * 4,
            "k_layer": [3] * 4,
            "layer": [1, 1, 2, 2],
            "seed": [0, 1, 0, 1],
            "auc": [0.6, 0.8, None, 0.5],
        }
    )
    s = awareness_summary(aware)
    assert s["layer"].to_list() == [1, 2] and s["n_seeds"].to_list() == [2, 1]
    assert s["mean_auc"][0] == pytest.approx(0.7) and s["sd_auc"][0] == pytest.approx(
        np.std([0.6, 0.8], ddof=1)
    )
    assert awareness_summary(aware.clear()).height == 0


def test_detection_table_takes_the_callers_probing_predictions():
    """experiments.run hands over the layer-K probe it already fit: the same table as fitting it again."""
    from truthflow.pathways.probes import crossfit_seeds, n_folds

    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 16)).astype(np.float32)
    y = (x[:, 0] + rng.normal(size=60) > 0).astype(int)
    g, score = rng.random(60) < 0.4, {"length": np.arange(60.0)}
    probe = {"seeds": [0, 1], "C": 1.0, "max_iter": 2000, "test_size": 0.2}
    prob = crossfit_seeds(x, [x], y, probe["seeds"], n_folds(0.2), 1.0, 2000)[0]
    own = detection_table(x, y, g, {}, score, [2.0], probe)
    assert detection_table(x, y, g, {}, score, [2.0], probe, probing=prob).equals(own)
    assert not detection_table(x, y, g, {}, score, [2.0], probe, probing=1 - prob).equals(own)
