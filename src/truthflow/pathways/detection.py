"""Pathway awareness and hallucination detection ("Two Pathways to Truthfulness" §4–5; METHOD A16-A17).
Per sample: a label y (1 = correct), a group g (True = Q-Anchored), hidden states x [N, D] at one layer; every
estimate is cross-fitted (probes.crossfit), else a null auc and a status saying why; ValueError: caller bugs.
A seed (an int or ints) gives numpy streams: 0 for the RandomGate, 1 the VanillaExperts split, 2 PR's one."""

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl

from .probes import (
    A_ANCHORED,
    Q_ANCHORED,
    crossfit,
    fit_predict,
    folds,
    n_folds,
    over_layers,
    roc_auc,
    split_reason,
)

Seed = int | Sequence[int]

MOP_VARIANTS = {  # method -> (gate, experts)
    "MoP": ("pathway", "pathway"),
    "MoP-RandomGate": ("random", "pathway"),
    "MoP-VanillaExperts": ("pathway", "vanilla"),
}
LEARNED = ("Probing", *MOP_VARIANTS, "PR")
GATE_THRESHOLD = 0.5  # PR: P(Q-Anchored | x) >= 0.5 routes a test sample to its `up` state
PR_VAL_SIZE = 0.25

AWARENESS_SCHEMA = dict.fromkeys(["layer", "seed"], pl.Int64) | {"auc": pl.Float64}
AWARENESS_SCHEMA |= dict.fromkeys(["n", "n_q", "n_a"], pl.Int64) | {"status": pl.String}
DETECTION_SCHEMA = {"method": pl.String, "seed": pl.Int64, "auc": pl.Float64, "n": pl.Int64}
DETECTION_SCHEMA |= dict.fromkeys(["factor", "status"], pl.String)


def _rng(seed: Seed, stream: int) -> np.random.Generator:
    return np.random.default_rng([*np.atleast_1d(np.asarray(seed, dtype=np.int64)).tolist(), stream])


def _probe_or_rate(x_tr, y_tr, x_te, C: float, max_iter: int) -> tuple[np.ndarray, str | None]:
    """Probe P(class 1) for x_te; a one-class training set predicts its rate (0 or 1) instead, and says so."""
    if y_tr.min() == y_tr.max():
        rate = float(y_tr.mean())
        return np.full(len(x_te), rate), f"one class only, constant {rate:g}"
    return fit_predict(x_tr, y_tr, [x_te], C, max_iter)[0], None


def _awareness_layer(layer: int, resid: np.ndarray, g: np.ndarray, k: int, probe: Mapping) -> list[float]:
    """The AUC of each seed's cross-fitted P(Q-Anchored) at one 1-based layer (read alone from resid)."""
    x = np.asarray(resid[:, layer - 1], dtype=np.float32)
    return [roc_auc(g, crossfit(x, g, seed, k, probe["C"], probe["max_iter"])[0]) for seed in probe["seeds"]]


def awareness_auc(
    resid: np.ndarray, groups, layers: Sequence[int], probe: Mapping, workers: int = 1
) -> pl.DataFrame:
    """Pathway awareness (§4, A16) from hidden states [N, L, D]: per seed and 1-based layer, the AUC of the
    cross-fitted P(Q-Anchored); a split that cannot be made or a layer outside 1..L gives a null auc;
    workers: processes fitting layers side by side (`probes.over_layers`)."""
    g = np.asarray(groups, dtype=bool)
    n, n_layers = resid.shape[:2]
    if len(g) != n:
        raise ValueError(f"groups has {len(g)} entries, resid {n} samples")
    n_q, k = int(g.sum()), n_folds(probe["test_size"])
    reason = split_reason(g, k, Q_ANCHORED, A_ANCHORED)
    if reason is None and min(n_q, n - n_q) < k:
        # a test fold without a sample of the smaller group makes its scores incomparable with the others'
        reason = f"fewer samples in a group than the {k} folds ({n_q} {Q_ANCHORED}, {n - n_q} {A_ANCHORED})"
    rows = []
    fitted = [layer for layer in layers if not reason and 1 <= layer <= n_layers]
    aucs = dict(zip(fitted, over_layers(_awareness_layer, fitted, workers, resid, g, k, probe), strict=True))
    for layer in layers:
        base = {"layer": int(layer), "n": n, "n_q": n_q, "n_a": n - n_q}
        if layer not in aucs:
            bad = reason or f"layer {layer} not in 1..{n_layers}"
            rows += [{**base, "seed": s, "auc": None, "status": f"undefined: {bad}"} for s in probe["seeds"]]
            continue
        rows += [
            {**base, "seed": s, "auc": auc, "status": "ok"}
            for s, auc in zip(probe["seeds"], aucs[layer], strict=True)
        ]
    return pl.DataFrame(rows, schema=AWARENESS_SCHEMA).sort(["layer", "seed"])


def awareness_summary(aware: pl.DataFrame) -> pl.DataFrame:
    """Per (model, dataset, k_layer, layer): mean and sd of the awareness AUC over the seeds with one."""
    if aware.height == 0:
        return aware
    keys = ["model", "dataset", "k_layer", "layer"]
    stats = {"mean_auc": pl.col("auc").mean(), "sd_auc": pl.col("auc").std(), "n_seeds": pl.len()}
    return aware.filter(pl.col("auc").is_not_null()).group_by(keys).agg(**stats).sort(keys)


def gate_probs(x, g, train, test, C: float = 1.0, max_iter: int = 2000) -> tuple[np.ndarray, str | None]:
    """w = P(Q-Anchored | x) for x[test], probe fit on (x, g)[train]; one group in train: its rate, a note."""
    w, note = _probe_or_rate(x[train], g[train].astype(int), x[test], C, max_iter)
    return w, (f"gate: train holds one group only, w = {g[train].mean():g}" if note else None)


def random_gate(n: int, seed: Seed) -> np.ndarray:
    """The RandomGate ablation: w ~ Uniform(0, 1), n draws from stream 0 of the seed."""
    return _rng(seed, 0).uniform(0.0, 1.0, size=n)


def vanilla_split(train, n_q: int, seed: Seed) -> tuple[np.ndarray, np.ndarray]:
    """The VanillaExperts ablation: train split at random (stream 1) into sorted parts of n_q and the rest."""
    perm = _rng(seed, 1).permutation(np.asarray(train))
    return np.sort(perm[:n_q]), np.sort(perm[n_q:])


def mop_predict(
    x, y, g, train, test, gate="pathway", experts="pathway", seed: Seed = 0, C=1.0, max_iter=2000
) -> tuple[np.ndarray, list[str]]:
    """Mixture of Pathways (§5): P(y = 1) = w·expert_Q + (1 − w)·expert_A for x[test], and the fallbacks; gate
    "random", experts "vanilla": ablations; a one-class expert gives its rate, an empty one y's train rate."""
    if gate not in ("pathway", "random") or experts not in ("pathway", "vanilla"):
        raise ValueError(
            f"gate must be 'pathway' or 'random', experts 'pathway' or 'vanilla': {gate}, {experts}"
        )
    n_q, rand = int(g[train].sum()), gate == "random"
    w, note = (random_gate(len(test), seed), None) if rand else gate_probs(x, g, train, test, C, max_iter)
    notes = [note] if note else []
    subsets = (train[g[train]], train[~g[train]]) if experts == "pathway" else vanilla_split(train, n_q, seed)
    preds = []
    for name, idx in zip(("Q", "A"), subsets, strict=True):
        if len(idx):
            p, note = _probe_or_rate(x[idx], y[idx], x[test], C, max_iter)
        else:
            p = np.full(len(test), y[train].mean())
            note = f"no training samples, constant train rate {y[train].mean():g}"
        preds.append(p)
        notes += [f"expert {name}: {note}"] if note else []
    return w * preds[0] + (1 - w) * preds[1], notes


def pr_states(up, down, x_clean, g, train, test, C: float = 1.0, max_iter: int = 2000):
    """PR routing (Q-Anchored: up, else down) -> (train states by g, test ones by the gate, q_test, note)."""
    w, note = gate_probs(x_clean, g, train, test, C, max_iter)
    q_te = w >= GATE_THRESHOLD
    s_tr = np.where(g[train][:, None], up[train], down[train])
    s_te = np.where(q_te[:, None], up[test], down[test])
    return s_tr, s_te, q_te, note


def _pr_fit(pair, x_clean, y, g, train, test, C, max_iter) -> tuple[np.ndarray, list[str]]:
    if pair is None:  # factor 1.0: x_clean itself, i.e. plain probing
        p, note = _probe_or_rate(x_clean[train], y[train], x_clean[test], C, max_iter)
        return p, [note] if note else []
    s_tr, s_te, _, gnote = pr_states(*pair, x_clean, g, train, test, C, max_iter)
    p, note = _probe_or_rate(s_tr, y[train], s_te, C, max_iter)
    return p, [n for n in (gnote, note) if n]


def _pr_candidates(states, factors) -> dict[float, tuple | None]:
    """Factor -> (up, down) as float32, factor 1.0 -> None (x_clean itself), in ascending order."""
    by_value = {float(f): pair for f, pair in (states or {}).items()} | {1.0: None}
    cands = {1.0: None}
    for f in map(float, factors):  # the schema keeps them >= 1: down uses 1/f
        if f not in by_value:
            raise ValueError(f"no reweighted states for factor {f:g}")
        cands[f] = None if f == 1.0 else tuple(np.asarray(s, dtype=np.float32) for s in by_value[f])
    return dict(sorted(cands.items()))


def _inner_split(y, train, seed: Seed) -> tuple[np.ndarray, np.ndarray] | str:
    """Stratified split of train, round(PR_VAL_SIZE · n) of each class (1..n−1) to validation; or why not."""
    if reason := split_reason(y[train], 2):
        return f"inner validation split impossible: {reason}"
    rng, val = _rng(seed, 2), []
    for c in (0, 1):
        idx = train[y[train] == c]
        m = min(max(1, round(PR_VAL_SIZE * len(idx))), len(idx) - 1)
        val.append(rng.choice(idx, size=m, replace=False))
    val = np.sort(np.concatenate(val))
    return np.setdiff1d(train, val), val


def pr_select_and_predict(
    states, x_clean, y, g, train, test, factors, seed: Seed = 0, C=1.0, max_iter=2000
) -> tuple[np.ndarray, float, list[str]]:
    """Pathway Reweighting (§5, A16) -> (test P(y = 1), the factor, notes); states[f] = (up, down) [N, D],
    E_Q -> answer attention ×f, ×1/f; the factor (gate included) is chosen on `_inner_split`, else 1.0."""
    cands, inner = _pr_candidates(states, factors), _inner_split(y, train, seed)
    if isinstance(inner, str):
        chosen, notes = 1.0, [f"{inner}; factor 1 (plain probing)"]
    else:  # cands ascend, and max keeps the first of equal AUCs: ties go to the smallest factor
        val = {f: _pr_fit(pair, x_clean, y, g, *inner, C, max_iter)[0] for f, pair in cands.items()}
        chosen, notes = max(val, key=lambda f: roc_auc(y[inner[1]], val[f])), []
    p, fit_notes = _pr_fit(cands[chosen], x_clean, y, g, train, test, C, max_iter)
    return p, chosen, notes + fit_notes


def _baseline_row(name: str, seed: int, score, y: np.ndarray) -> dict:
    score = np.asarray(score, dtype=float)
    row = {"method": name, "seed": seed, "n": 0}
    if score.shape != y.shape:
        return {**row, "status": f"undefined: {len(score)} scores for {len(y)} samples"}
    ok = np.isfinite(score)
    row["n"], n_pos = int(ok.sum()), int(y[ok].sum())
    if n_pos in (0, row["n"]):  # an AUC needs one sample of each class, no more
        counts = f"{n_pos} correct, {row['n'] - n_pos} wrong"
        return {**row, "status": f"undefined: one class only among the finite scores ({counts})"}
    status = "ok" if row["n"] == len(y) else f"ok ({len(y) - row['n']} non-finite scores dropped)"
    return {**row, "auc": roc_auc(y[ok], score[ok]), "status": status}


def detection_table(
    x, y, groups, states, baselines: Mapping, factors: Sequence[float], probe: Mapping, probing=None
):
    """The paper's Table 3 for one (model, dataset) (METHOD A17): each baseline score (higher = more likely
    correct), Probing, the MoP variants and PR (`factor`: chosen per fold, "2,2,4,2,2"); fold i of seed s
    seeds its draws with (s, i); AUC over all N out-of-fold predictions. `probing`: crossfit_seeds' [S, N]."""
    x, y, g = np.asarray(x, dtype=np.float32), np.asarray(y), np.asarray(groups, dtype=bool)
    if not np.isin(y, [0, 1]).all():
        raise ValueError("y must hold 0/1 (or bools) only")
    y = y.astype(int)
    n, C, max_iter, k = len(y), probe["C"], probe["max_iter"], n_folds(probe["test_size"])
    if x.shape[0] != n or len(g) != n:
        raise ValueError(f"x has {x.shape[0]} rows, y {n}, groups {len(g)}")
    reason = split_reason(y, k)
    try:
        pr_reason, cands = None, _pr_candidates(states, factors)
        if any(pair is not None and pair[0].shape != x.shape for pair in cands.values()):
            pr_reason = f"reweighted states must have the shape of x {x.shape}"
    except ValueError as err:
        pr_reason = str(err)
    rows = []
    for s, seed in enumerate(probe["seeds"]):
        rows += [_baseline_row(name, seed, score, y) for name, score in baselines.items()]
        if reason:
            rows += [{"method": m, "seed": seed, "n": n, "status": f"undefined: {reason}"} for m in LEARNED]
            continue
        oof, notes, chosen = {m: np.zeros(n) for m in LEARNED}, {m: [] for m in LEARNED}, []
        oof["Probing"] = probing[s] if probing is not None else crossfit(x, y, seed, k, C, max_iter)[0]
        for i, (train, test) in enumerate(folds(y, k, seed)):
            for m, (gate, experts) in MOP_VARIANTS.items():
                oof[m][test], nts = mop_predict(x, y, g, train, test, gate, experts, (seed, i), C, max_iter)
                notes[m] += [f"fold {i + 1}: {t}" for t in nts]
            if pr_reason is None:
                oof["PR"][test], f, nts = pr_select_and_predict(
                    cands, x, y, g, train, test, factors, (seed, i), C, max_iter
                )
                notes["PR"] += [f"fold {i + 1}: {t}" for t in nts]
                chosen.append(f"{f:g}")
        for m in LEARNED:
            row = {"method": m, "seed": seed, "n": n, "factor": ",".join(chosen) if m == "PR" else None}
            if m == "PR" and pr_reason is not None:
                rows.append({**row, "factor": None, "status": f"undefined: {pr_reason}"})
                continue
            uniq = list(dict.fromkeys(notes[m]))
            status = "ok" if not uniq else "ok (fallback: " + "; ".join(uniq) + ")"
            rows.append({**row, "auc": roc_auc(y, oof[m]), "status": status})
    return pl.DataFrame(rows, schema=DETECTION_SCHEMA)


def detection_summary(table: pl.DataFrame, keys: Sequence[str] = ()) -> pl.DataFrame:
    """Per (keys, method): mean, sd (ddof=1; 0 if all agree) of the AUC over ok seeds, n_seeds and n."""
    auc = pl.col("auc").filter(pl.col("status").str.starts_with("ok"))
    sd = pl.when(auc.len() < 2).then(None).when(auc.n_unique() == 1).then(0.0).otherwise(auc.std())
    return table.group_by([*keys, "method"], maintain_order=True).agg(
        auc.mean().alias("mean"), sd.alias("sd"), auc.len().cast(pl.Int64).alias("n_seeds"), pl.col("n").max()
    )


def _cell(r: dict) -> str:
    if r["mean"] is None:
        return "–"
    return f"{100 * r['mean']:.2f}" + ("" if r["sd"] is None else f" ± {100 * r['sd']:.2f}")


def table3(detection: pl.DataFrame, display: Mapping[str, str]) -> pl.DataFrame:
    """The paper's Table 3 layout: one row per (model, method), one column per dataset, 'mean ± sd' of the
    test AUC (%) over the probe seeds. display: dataset -> column title, in column order; others follow."""
    if detection.height == 0:
        return pl.DataFrame(schema={"model": pl.String, "method": pl.String})
    present = set(detection["dataset"])
    datasets = [d for d in display if d in present] + sorted(present - set(display))
    cell = pl.struct("mean", "sd").map_elements(_cell, return_dtype=pl.String).alias("cell")
    cells = detection_summary(detection, ("model", "dataset")).select("model", "method", "dataset", cell)
    wide = cells.pivot(on="dataset", index=["model", "method"], values="cell")
    models, methods = (detection.select(c).unique(maintain_order=True) for c in ("model", "method"))
    grid = models.join(methods, how="cross")
    return grid.join(wide, on=["model", "method"], how="left", maintain_order="left").select(
        "model", "method", *(pl.col(d).fill_null("–").alias(display.get(d, d)) for d in datasets)
    )
