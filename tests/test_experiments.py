"""Section 3.2-5 experiments (docs/method.md A12-A17): hand-computed cases for the donor swap, the answer-only
input, the Pathway Reweighting mask (only the intended edges, and what it does to the softmax), flip
counting, and exactness of the early-stopping passes on a tiny random-weight Llama."""

from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
import torch
import transformers
from conftest import answer_logprobs, resid_states

from truthflow.engine import Condition, batches, passes
from truthflow.engine.masks import attention_mask as knockout_mask
from truthflow.engine.masks import reweight_mask
from truthflow.errors import TruthflowError
from truthflow.models import LoadedModel
from truthflow.pathways import experiments, interventions

MIN = torch.finfo(torch.float32).min


# ------------------------------------------------------------------ A12 token patching
def test_donor_swap_keeps_lengths_hand_case():
    ids = ["a", "b", "c", "d"]
    seqs = [[1, 10, 11, 2, 3], [1, 20, 21, 2, 4], [1, 30, 2, 5, 6], [1, 2, 40, 7, 8]]
    eq = [[1, 2], [1, 2], [1], [2]]  # a, b: |E_Q| 2; c, d: |E_Q| 1
    ctrl = [[3, 4], None, [3], [3]]
    out = interventions.patched_inputs(ids, seqs, eq, ctrl, seed=0)
    # same-length donors exist for everyone: a <-> b, c <-> d
    assert out["donor"] == ["b", "a", "d", "c"] and all(out["length_matched"])
    assert out["target"][0] == [1, 20, 21, 2, 3]  # b's E_Q ids written over a's E_Q
    assert out["target"][2] == [1, 40, 2, 5, 6]
    assert out["target"][3] == [1, 2, 30, 7, 8]
    assert out["control"][0] == [1, 10, 11, 20, 21]  # the same donor ids over the control positions
    assert out["control"][1] == seqs[1]  # no control: unpatched (and left out downstream)
    assert all(len(t) == len(s) for t, s in zip(out["target"], seqs, strict=True))
    # seeded: the same seed gives the same donors
    assert interventions.patched_inputs(ids, seqs, eq, ctrl, seed=0)["donor"] == out["donor"]


def test_donor_of_another_length_is_cycled_or_cut_and_counted():
    donors = interventions.choose_donors(["a", "b"], [3, 1], seed=1)
    assert donors == [(1, False), (0, False)]
    assert interventions.donor_tokens([7], 3) == [7, 7, 7]
    assert interventions.donor_tokens([7, 8, 9], 2) == [7, 8]
    assert interventions.choose_donors(["only"], [2], seed=0) == [(-1, False)]
    with pytest.raises(ValueError):
        interventions.patch([1, 2, 3], [0, 1], [5])


# ------------------------------------------------------------------ A13 answer only
def test_answer_only_input_construction():
    seqs = [[1, 50, 51, 52, 60, 61, 62], [1, 50, 70]]
    out, pos = interventions.answer_only_inputs(seqs, prompt_lens=[4, 2], probe_pos=[5, 2], bos_id=1)
    assert out == [[1, 60, 61, 62], [1, 70]]
    assert pos == [2, 1]  # the same answer token: 61 and 70
    assert [o[p] for o, p in zip(out, pos, strict=True)] == [61, 70]
    out, pos = interventions.answer_only_inputs(seqs, [4, 2], [5, 2], bos_id=None)
    assert out == [[60, 61, 62], [70]] and pos == [1, 0]
    with pytest.raises(ValueError):
        interventions.answer_only_inputs(seqs, [4, 2], [3, 2], bos_id=None)  # probe inside the prompt


# ------------------------------------------------------------------ A16 Pathway Reweighting
def test_reweight_mask_touches_only_the_intended_edges():
    valid = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]], dtype=torch.bool)
    queries = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 1, 1, 0]], dtype=torch.bool)
    keys = torch.tensor([[0, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    clean = knockout_mask(valid, torch.zeros_like(valid), torch.float32)
    mask = reweight_mask(valid, queries, keys, 2.0, torch.float32)
    diff = (mask - clean)[:, 0]
    log2 = float(np.log(2.0))
    expected0 = torch.zeros(5, 5)
    expected0[3, 1] = expected0[3, 2] = expected0[4, 1] = expected0[4, 2] = log2
    expected1 = torch.zeros(5, 5)
    expected1[2, 0] = expected1[3, 0] = log2  # query 4 is padding: untouched
    assert torch.allclose(diff[0], expected0) and torch.allclose(diff[1], expected1)
    assert (mask[clean == MIN] == MIN).all()  # blocked cells stay blocked
    assert torch.equal(reweight_mask(valid, queries, keys, 1.0, torch.float32), clean)
    with pytest.raises(ValueError):
        reweight_mask(valid, queries, keys, 0.0, torch.float32)


def test_reweight_mask_multiplies_the_attention_weights_and_renormalizes():
    """Added to attention scores, reweight_mask's row of a query multiplies the weights of its reweighted
    keys by the factor and renormalizes (hand case); a row that is not a query keeps the causal softmax."""
    valid = torch.ones(1, 4, dtype=torch.bool)
    queries = torch.tensor([[0, 0, 0, 1]], dtype=torch.bool)
    keys = torch.tensor([[0, 1, 0, 1]], dtype=torch.bool)
    mask = reweight_mask(valid, queries, keys, 3.0, torch.float32)[0, 0]
    scores = torch.tensor([0.3, -1.2, 0.8, 0.1])
    w = torch.exp(scores) * torch.tensor([1.0, 3.0, 1.0, 3.0])
    assert torch.allclose(torch.softmax(scores + mask[3], dim=0), w / w.sum(), atol=1e-7)
    plain = torch.softmax(scores[:3], dim=0)
    assert torch.allclose(
        torch.softmax(scores + mask[2], dim=0), torch.cat([plain, torch.zeros(1)]), atol=1e-7
    )


# ------------------------------------------------------------------ passes on a tiny real architecture
@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        num_hidden_layers=3,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=64,
        max_position_embeddings=128,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    return LoadedModel(model=model, tokenizer=SimpleNamespace(pad_token_id=0), info={}, device="cpu")


def _seqs():
    rng = np.random.default_rng(3)
    return [[int(t) for t in rng.integers(1, 64, n)] for n in (12, 9, 15)]


def test_stopped_pass_equals_the_full_sweep_at_layer_k(tiny):
    seqs = _seqs()
    probe = [10, 8, 13]
    clean = resid_states(tiny, seqs, probe, [Condition()], 2, out=[np.zeros((3, 3, 32), np.float32)])[0]

    def at_layer(layer, probe=probe, **cond):
        out = np.zeros((3, 32), np.float32)
        return resid_states(tiny, seqs, probe, [Condition(**cond)], 3, layer, [out])[0]

    for layer in (1, 2, 3):
        assert np.allclose(at_layer(layer), clean[:, layer - 1], atol=1e-5)
    # factor 1 on any edges is the clean pass
    edges = ([[9, 10], [7, 8], [12, 13]], [[1, 2], [3], [0, 4]])
    assert np.allclose(at_layer(3, edges=edges, factor=1.0), clean[:, 2], atol=1e-5)
    assert not np.allclose(at_layer(3, edges=edges, factor=4.0), clean[:, 2], atol=1e-3)
    # edges whose queries come after the probe position change nothing at the probe
    late = ([[11], [8], [14]], [[1], [3], [0]])
    after = at_layer(3, [10, 7, 13], edges=late, factor=4.0)
    assert np.allclose(after, at_layer(3, [10, 7, 13]), atol=1e-5)


def test_answer_logprobs_match_the_full_logits(tiny):
    seqs = _seqs()
    ea = [[5, 6], [8], [3, 9, 10]]
    mean, low = answer_logprobs(tiny, seqs, ea, batch_size=2)
    with torch.no_grad():
        for i, s in enumerate(seqs):
            lp = torch.log_softmax(tiny.model(torch.tensor([s])).logits[0].float(), -1)
            vals = np.array([lp[p - 1, s[p]].item() for p in ea[i]])
            assert mean[i] == pytest.approx(vals.mean(), abs=1e-5)
            assert low[i] == pytest.approx(vals.min(), abs=1e-5)


def test_shared_head_runs_once_and_changes_nothing(tiny, monkeypatch):
    """Rows that share a head (a chat header) run it once (`head_cache`); log-probabilities and P(True)
    equal the per-sequence full logits either way."""
    head = [int(t) for t in np.random.default_rng(9).integers(1, 64, 10)]
    seqs = [head + s for s in _seqs()]
    assert batches.common_head(seqs, 100) == 10 and batches.common_head(seqs, 4) == 4
    assert batches.common_head([[1, 2], [1, 3]], 9) == 1 and batches.common_head([], 5) == 0
    ea = [[15, 16], [18], [13, 19, 20]]
    calls = []
    real = passes.head_cache
    monkeypatch.setattr(passes, "head_cache", lambda *a: calls.append(a[2]) or real(*a))
    shared = answer_logprobs(tiny, seqs, ea, batch_size=3)
    assert calls == [10]  # the whole head (E_A starts after it), once for the batch
    monkeypatch.setattr(batches, "MIN_SHARED_PREFIX", 10**6)
    full = answer_logprobs(tiny, seqs, ea, batch_size=3)
    assert calls == [10]
    with torch.no_grad():
        for i, s in enumerate(seqs):
            lp = torch.log_softmax(tiny.model(torch.tensor([s])).logits[0].float(), -1)
            vals = np.array([lp[p - 1, s[p]].item() for p in ea[i]])
            for got in (shared, full):
                assert got[0][i] == pytest.approx(vals.mean(), abs=1e-5)
                assert got[1][i] == pytest.approx(vals.min(), abs=1e-5)


def test_p_true_is_the_two_way_softmax(tiny):
    class Tok:
        pad_token_id = 0

        def __call__(self, text, add_special_tokens=False):
            return {
                "input_ids": [
                    {"True": 5, " True": 5, "true": 6, " true": 6}.get(text, 7 if "alse" in text else 8)
                ]
            }

    lm = LoadedModel(model=tiny.model, tokenizer=Tok(), info={}, device="cpu")
    assert interventions.verdict_token_ids(lm.tokenizer) == ([5, 6], [7])
    prompts = _seqs()
    got = interventions.p_true(lm, prompts, batch_size=2)
    with torch.no_grad():
        for i, s in enumerate(prompts):
            logits = tiny.model(torch.tensor([s])).logits[0, -1].float()
            lt, lf = torch.logsumexp(logits[[5, 6]], 0), logits[7]
            assert got[i] == pytest.approx(torch.sigmoid(lt - lf).item(), abs=1e-5)


# ------------------------------------------------------------------ flip counting and group summaries
AT = {"layer": 3, "n_boot": 100, "seed": 0}  # the experiment layer K and the bootstrap settings


def test_patching_flip_counting_hand_case():
    # 2 seeds x 4 samples; probabilities of 'correct'
    prob = np.array([[0.9, 0.8, 0.6, 0.3], [0.7, 0.4, 0.6, 0.2]])
    patched = np.array([[0.2, 0.9, 0.4, 0.1], [0.6, 0.1, 0.3, 0.1]])
    control = np.array([[0.9, 0.9, 0.7, 0.1], [0.3, 0.9, 0.6, 0.1]])
    correct = np.array([1, 1, 1, 0])
    groups = np.array([True, True, False, False])
    rows = experiments.patching_rows(
        prob, patched, control, correct, groups, np.array([1, 0, 1, 1], bool), AT
    )
    by = {(r["condition"], r["group"]): r for r in rows}
    # sample 0: both seeds predict correct; seed 0 flips -> 50%. sample 1: mean 0.6 -> eligible; only seed 0
    # predicts correct and it does not flip -> 0%. sample 2: both seeds predict correct, both flip -> 100%.
    # sample 3: wrong answer -> not eligible.
    assert by[("E_Q", "Q-Anchored")]["n"] == 2 and by[("E_Q", "Q-Anchored")]["value"] == pytest.approx(25.0)
    assert by[("E_Q", "A-Anchored")]["n"] == 1 and by[("E_Q", "A-Anchored")]["value"] == pytest.approx(100.0)
    # control: sample 1 has none; sample 0 flips in seed 1 -> 50%; sample 2 never -> 0%
    assert by[("random", "Q-Anchored")]["n"] == 1 and by[("random", "Q-Anchored")]["value"] == pytest.approx(
        50.0
    )
    assert by[("random", "A-Anchored")]["value"] == pytest.approx(0.0)
    assert np.isnan(by[("random", "A-Anchored")]["ci_low"])  # one sample: no CI, never a zero-width one


def test_answer_only_minus_delta_p_hand_case():
    prob = np.array([[0.8, 0.2]])  # sample 0 predicted correct (p 0.8), sample 1 wrong (p 0.8)
    prob_ao = np.array([[0.4, 0.6]])
    rows = experiments.answer_only_rows(prob, prob_ao, np.array([True, False]), AT)
    # sample 0: ΔP = 100 (0.4 - 0.8) / 0.8 = -50 -> -ΔP 50; sample 1: p_ko(wrong) 0.4 -> -ΔP 50
    assert [r["value"] for r in rows] == [pytest.approx(50.0), pytest.approx(50.0)]


def test_boundary_rows_and_groups_hand_case():
    deltap = pl.DataFrame(
        {
            "id": ["a", "b", "c", "a", "b", "c"],
            "layer": [1, 1, 1, 2, 2, 2],
            "knockout": ["target"] * 6,
            "anchor": ["Q-Anchored", "A-Anchored", "A-Anchored", "Q-Anchored", "Q-Anchored", "A-Anchored"],
        }
    )
    assert experiments.groups_at(deltap, ["a", "b", "c"], 2).tolist() == [True, True, False]
    rows = experiments.boundary_rows(
        deltap,
        {"a": True, "b": False, "c": True},
        {"a": False, "b": True, "c": False},
        {"a": 100.0, "b": 10.0, "c": 0.0},
        {"layer": 2, "n_boot": 50, "seed": 0},
    )
    by = {(r["condition"], r["group"], r["layer"]): r for r in rows}
    assert by[("accuracy", "A-Anchored", 1)]["value"] == pytest.approx(50.0)
    assert by[("accuracy", "Q-Anchored", 2)]["value"] == pytest.approx(50.0)
    assert by[("refusal", "Q-Anchored", 2)]["value"] == pytest.approx(50.0)
    # popularity only at K = 2; c's s_pop 0 has no log and is left out
    assert by[("log10 popularity", "Q-Anchored", 2)]["value"] == pytest.approx(1.5)
    assert by[("log10 popularity", "A-Anchored", 2)]["n"] == 0
    assert ("log10 popularity", "Q-Anchored", 1) not in by
    with pytest.raises(ValueError, match="no knockout anchor"):
        experiments.groups_at(deltap, ["a", "zz"], 1)


def test_experiment_layer_choice():
    auc = pl.DataFrame(
        {"layer": [1, 2, 3, 1, 2, 3], "auc": [0.6, 0.8, 0.8, 0.7, 0.8, 0.8], "status": ["ok"] * 6}
    )
    assert experiments.experiment_layer("auto", auc, 3)[0] == 2  # tie between 2 and 3: the lowest
    assert experiments.experiment_layer(3, auc, 3) == (3, "pathways.experiments.layer")
    with pytest.raises(TruthflowError, match="m1 has 3 layers: set a layer in 1..3"):
        experiments.experiment_layer(4, auc, 3, "m1")
    undefined = pl.DataFrame({"layer": [None], "auc": [None], "status": ["probe undefined: one class"]})
    assert experiments.experiment_layer("auto", undefined, 30) == (15, "probe undefined: middle layer")


@pytest.mark.parametrize("model", ["tiny"])  # the real architectures: test_architectures (twins)
def test_conditions_from_a_shared_prefix_equal_full_passes(model, request, monkeypatch):
    """Patching and reweighting passes that start from the clean prefix's keys and values (stopped at K)
    give the states of full passes, one condition at a time."""
    lm = request.getfixturevalue(model)
    rng = np.random.default_rng(5)
    vocab = 60
    seqs = [[int(t) for t in rng.integers(1, vocab, n)] for n in (30, 26, 34)]
    probe = [27, 25, 31]
    answer = [list(range(22, p + 1)) for p in probe]
    eq = [[12, 13], [10], [14, 15]]
    patched = [interventions.patch(s, e, [7] * len(e)) for s, e in zip(seqs, eq, strict=True)]
    conds = [
        Condition(tokens=patched),
        Condition(edges=(answer, eq), factor=3.0),
        Condition(edges=(answer, eq), factor=1 / 3.0),
    ]
    layers = len(lm.model.model.layers)
    k = max(1, layers // 2)
    got = resid_states(lm, seqs, probe, conds, 3, layer=k)
    cut = [s[: p + 1] for s, p in zip(seqs, probe, strict=True)]
    assert passes.first_change(conds, [0, 1, 2], cut) == 10
    monkeypatch.setattr(batches, "MIN_SHARED_PREFIX", 10**9)
    for c, g in zip(conds, got, strict=True):
        alone = Condition(edges=c.edges, factor=c.factor)
        ref = resid_states(lm, c.tokens or seqs, probe, [alone], 3, layer=k)[0]
        scale = np.abs(ref.astype(np.float32)).max()
        assert np.abs(g.astype(np.float32) - ref.astype(np.float32)).max() <= 2e-3 * scale


def test_rate_rows_have_wilson_cis_never_zero_width():
    """Flip rates, accuracy and refusal are rates: Wilson CIs, so 0% of 6 samples is not '[0, 0]'."""
    prob = np.full((2, 6), 0.9)  # every sample predicted correct by both seeds, and none flips
    rows = experiments.patching_rows(
        prob, prob.copy(), prob.copy(), np.ones(6), np.zeros(6, bool), np.ones(6, bool), AT
    )
    a = next(r for r in rows if r["condition"] == "E_Q" and r["group"] == "A-Anchored")
    # 0 of 6: upper = 2 * (z^2 / 12) / (1 + z^2 / 6) = 0.64027 / 1.64027 = 0.39034
    assert a["n"] == 6 and a["value"] == 0.0 and a["ci_low"] == 0.0
    assert a["ci_high"] == pytest.approx(39.034, abs=1e-2)


def _pair(n=40, n_layers=3, d=4, seed=0):
    """One (model, dataset)'s inputs of experiments.run: labels carried by feature 0 of every state."""
    from truthflow.pathways.probes import run_probes

    rng = np.random.default_rng(seed)
    ids = [f"s{i}" for i in range(n)]
    correct = np.arange(n) % 2 == 0
    clean = rng.normal(size=(n, n_layers, d)).astype(np.float16)
    clean[:, :, 0] += np.where(correct, 2.0, -2.0)[:, None]
    ko = (clean + rng.normal(scale=2.0, size=clean.shape)).astype(np.float16)
    probe = {"seeds": [0], "test_size": 0.2, "C": 1.0, "max_iter": 200}
    _, deltap = run_probes(clean, [ko, clean], correct.astype(int), ids, probe)
    samples = pl.DataFrame({"id": ids, "correct": correct, "refusal": np.arange(n) % 5 == 0})
    scores = pl.DataFrame(
        {
            "id": ids,
            "layer": [2] * n,
            "donor": ids[::-1],
            "donor_length_matched": [True] * n,
            "patch_control_matched": np.arange(n) % 3 > 0,
            "p_true": rng.random(n),
            "logit_mean": rng.random(n),
            "logit_min": rng.random(n),
            "s_eq_ea": [[0.1, 0.3]] * (n - 1) + [[]],
            "s_eq_all": [[0.2, 0.2]] * n,
        },
        schema=experiments.SCORES_SCHEMA,
    )
    data = pl.DataFrame({"id": ids, "s_pop": rng.integers(1, 10**4, n)})
    x = clean[:, 1]
    states = (np.stack([ko[:, 1], x]), ko[:, 1], np.stack([x, x, x, ko[:, 1]]))
    return samples, scores, deltap, data, clean, states, probe


def test_run_gives_every_table_with_k_layer():
    samples, scores, deltap, data, clean, states, probe = _pair()
    keys = {"model": "m", "dataset": "nq"}
    rows, aware, det, per_sample = experiments.run(
        samples, scores, deltap, data, clean, states, probe, {"n": 50, "seed": 0}, [2.0, 4.0], keys
    )
    for t in (rows, aware, det, per_sample):
        assert t.columns[:3] == list(experiments.TABLE_KEYS) and t["k_layer"].unique().to_list() == [2]
    assert set(rows["experiment"]) == {"patching", "answer_only", "boundary", "saliency"}
    assert rows.columns[3:] == list(experiments.ROW_SCHEMA)
    assert sorted(aware["layer"].unique()) == [1, 3]  # every layer but K
    assert det["method"].unique(maintain_order=True).to_list()[:4] == [
        "P(True)",
        "Logits-mean",
        "Logits-min",
        "Probing",
    ]
    assert per_sample["s_eq_ea"][0] == pytest.approx(0.2) and np.isnan(per_sample["s_eq_ea"][-1])
    assert per_sample["s_pop"].to_list() == data["s_pop"].cast(pl.Float64).to_list()
    groups = experiments.groups_at(deltap, samples["id"].to_list(), 2)
    assert per_sample["group"].to_list() == np.where(groups, "Q-Anchored", "A-Anchored").tolist()
    # no ΔP rows (the probe is undefined): empty tables that keep their columns
    empty = experiments.run(
        samples, scores, deltap.clear(), data, clean, states, probe, {"n": 50, "seed": 0}, [2.0], keys
    )
    assert [t.height for t in empty] == [0, 0, 0, 0] and empty[0].columns == rows.columns


def test_extract_writes_the_passes_and_the_samples_table(tiny):
    from truthflow.pathways.extract import SAMPLES_SCHEMA, knockout_states
    from truthflow.pathways.saliency import saliency

    seqs = _seqs()
    kept = pl.DataFrame(
        {
            "id": ["a", "b", "c"],
            "correct": [True, False, True],
            "refusal": [False] * 3,
            "seq": seqs,
            "answer_start": [9, 8, 12],
            "eq_positions": [[1, 2], [3], [2, 3, 4]],
            "ea_positions": [[9, 10], [8], [13]],
            "probe_position": [10, 8, 13],
            "question_positions": [[1, 2, 3, 4, 5], [1, 2, 3, 4], [2, 3, 4, 5]],
            "eq_text": ["x"] * 3,
            "ea_text": ["y"] * 3,
        }
    )
    cfg = {
        "target": "exact_question",
        "control_draws": 2,
        "control_seed": 0,
        "mode": "cumulative",
        "window": 9,
    }
    out = (np.zeros((3, 3, 32), np.float32), [np.zeros((3, 3, 32), np.float32) for _ in range(3)])
    samples, scores = knockout_states(tiny, kept, 2, cfg, 2, "test", out)
    assert samples.schema == pl.Schema(SAMPLES_SCHEMA) and scores.schema == pl.Schema(
        experiments.SALIENCY_SCHEMA
    )
    # the saliency table is the separate saliency stage's; resid_clean the engine's clean condition (below)
    sep = saliency(tiny, seqs, [9, 8, 12], kept["eq_positions"].to_list(), kept["ea_positions"].to_list(), 2)
    assert scores["id"].to_list() == ["a", "b", "c"]
    np.testing.assert_allclose(scores["logit_mean"].to_numpy(), sep.logit_mean)
    np.testing.assert_allclose(np.array(scores["s_eq_ea"].to_list()), sep.scores[:, :, 0], equal_nan=True)
    assert samples["blocked_positions"].to_list() == kept["eq_positions"].to_list()
    assert samples["control_matched"].to_list() == [True, True, False] and samples["n_eq"].to_list() == [
        2,
        1,
        3,
    ]
    assert [len(c) for c in samples["control_positions"].to_list()] == [2, 2, 2]
    eq = kept["eq_positions"].to_list()
    f32 = [np.zeros((3, 3, 32), np.float32) for _ in range(2)]
    clean, ko = resid_states(tiny, seqs, [10, 8, 13], [Condition(), Condition(block=eq)], 2, out=f32)
    assert np.allclose(out[0], clean, atol=1e-5) and np.allclose(out[1][0], ko, atol=1e-5)
    none = (np.zeros((0, 3, 32)), [np.zeros((0, 3, 32))] * 3)
    empty, no_scores = knockout_states(tiny, kept.clear(), 2, cfg, 2, "test", none)
    assert empty.height == 0 and empty.schema == pl.Schema(SAMPLES_SCHEMA)
    assert no_scores.height == 0 and no_scores.schema == pl.Schema(experiments.SALIENCY_SCHEMA)


@pytest.mark.model
def test_experiment_states_on_a_real_model(smollm):
    """extract.experiment_states writes the patched, answer-only and reweighted states at K and the scores
    table; the patched states are the stopped passes over the donor-patched sequences."""
    from truthflow.generation import build_prompt, encode_prompt
    from truthflow.pathways.extract import experiment_states

    tok = smollm.tokenizer
    qa = [("What is the capital of France?", "Paris"), ("Who wrote Hamlet?", "Shakespeare"), ("2 + 2?", "4")]
    prompts = [encode_prompt(tok, build_prompt(tok, q, True), True) for q, _ in qa]
    answers = [tok(a, add_special_tokens=False)["input_ids"] for _, a in qa]
    ends = [len(p) + len(a) - 1 for p, a in zip(prompts, answers, strict=True)]
    table = pl.DataFrame(
        {
            "id": ["a", "b", "c"],
            "prompt_ids": prompts,
            "answer_ids": answers,
            "answer": [a for _, a in qa],
            "question": [q for q, _ in qa],
            "eq_positions": [[len(p) - 4, len(p) - 3] for p in prompts],
            "ea_positions": [list(range(len(p), e + 1)) for p, e in zip(prompts, ends, strict=True)],
            "probe_position": ends,
            "control_positions": [[[len(p) - 6, len(p) - 5]] for p in prompts],
            "control_matched": [True, True, False],
            # extract_pathways' saliency.parquet, passed through to the scores
            "logit_mean": [-1.0, -2.0, -3.0],
            "logit_min": [-2.0, -3.0, -4.0],
            "s_eq_ea": [[0.1, 0.2]] * 3,
            "s_eq_all": [[0.3, 0.4]] * 3,
        }
    )
    hidden = smollm.info["hidden_size"]
    outs = (
        np.zeros((2, 3, hidden), np.float32),
        np.zeros((3, hidden), np.float32),
        np.zeros((4, 3, hidden), np.float32),
    )
    cfg = {"pr_factors": [2.0, 4.0], "patch_seed": 0, "saliency_batch_size": 2}
    scores = experiment_states(smollm, table, 3, cfg, 3, True, {}, outs, "t")
    assert scores.schema == pl.Schema(experiments.SCORES_SCHEMA) and scores["layer"].to_list() == [3] * 3
    assert scores["patch_control_matched"].to_list() == [True, True, False]
    assert ((scores["p_true"] > 0) & (scores["p_true"] < 1)).all()
    assert scores["logit_min"].to_list() == [-2.0, -3.0, -4.0] and scores["s_eq_all"][2].to_list() == [
        0.3,
        0.4,
    ]
    seqs = [p + a for p, a in zip(prompts, answers, strict=True)]
    inputs = interventions.patched_inputs(
        ["a", "b", "c"],
        seqs,
        table["eq_positions"].to_list(),
        [[len(p) - 6, len(p) - 5] for p in prompts[:2]] + [None],
        0,
    )
    ref = np.zeros((3, hidden), np.float32)
    resid_states(smollm, inputs["target"], ends, [Condition()], 3, layer=3, out=[ref])
    assert np.allclose(outs[0][0], ref, atol=2e-3 * np.abs(ref).max())
    assert all(np.abs(o).sum() > 0 for o in (outs[1], outs[2][3]))


def test_experiment_states_of_no_samples_is_an_empty_scores_table():
    from truthflow.pathways.extract import experiment_states

    empty = pl.DataFrame(schema={"id": pl.String})
    scores = experiment_states(None, empty, 3, {}, 3, False, None, None, "t")
    assert scores.height == 0 and scores.schema == pl.Schema(experiments.SCORES_SCHEMA)
