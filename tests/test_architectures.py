"""The forward-pass math on tiny random twins of the four real architectures (truthflow.twins: Llama-3,
Gemma-3 with a sliding window of 8 and soft-caps, Mistral with a sliding window of 8, Qwen3 with q/k norms),
every sequence longer than the window. Each project pass is checked against a plain reference written here:
the model's own forward (its own causal, sliding-window and padding masks) with an attention function that
blocks or reweights the same cells, direct log-softmax of the model's own logits, and per-row HF generate."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import answer_logprobs, knockout_sweep, resid_states
from test_mink import reference_scores
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import eager_mask
from transformers.models.llama.modeling_llama import repeat_kv

from truthflow.depth.mink import score_texts
from truthflow.engine import Condition, backend, batches, passes
from truthflow.engine.hooks import decoder_layers
from truthflow.engine.masks import layer_windows
from truthflow.generation import (
    build_prompt,
    encode_prompt,
    eos_token_ids,
    generate_answers,
    newline_token_ids,
    strip_think,
)
from truthflow.models import load_model, prepare_model
from truthflow.pathways import interventions, saliency
from truthflow.twins import ARCHS, SPECIAL, WINDOW, build_twin, save_twin

MIN = torch.finfo(torch.float32).min
FIRST_BYTE = len(SPECIAL)  # byte tokens: FIRST_BYTE .. FIRST_BYTE + 255


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=ARCHS)
def twin(request):
    return build_twin(request.param)


def _rand(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(FIRST_BYTE, FIRST_BYTE + 256, n)]


# ------------------------------------------------------------------ reference: the model's own masks + edits
REF = "truthflow_twin_reference"
_EDIT: dict = {}  # block: [T, T] bool cells (query, key) to block; add: [T, T] float; layers: 0-based or None


def _reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention on the model's own mask (causal, sliding window, padding), plus the edits of _EDIT."""
    k = repeat_kv(key, module.num_key_value_groups)
    v = repeat_kv(value, module.num_key_value_groups)
    scores = torch.matmul(query, k.transpose(2, 3)) * (module.head_dim**-0.5 if scaling is None else scaling)
    if kwargs.get("softcap"):
        scores = torch.tanh(scores / kwargs["softcap"]) * kwargs["softcap"]
    if attention_mask is not None:
        scores = scores + attention_mask[..., : k.shape[-2]]
    if _EDIT.get("layers") is None or module.layer_idx in _EDIT["layers"]:
        if _EDIT.get("block") is not None:
            scores = scores.masked_fill(_EDIT["block"], MIN)
        if _EDIT.get("add") is not None:
            scores = scores + _EDIT["add"]
    probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    return torch.matmul(probs, v).transpose(1, 2).contiguous(), probs


AttentionInterface.register(REF, _reference_attention)
AttentionMaskInterface.register(REF, eager_mask)


def block_cells(n: int, block: list[int]) -> torch.Tensor:
    """Knockout cells by definition: a query after a blocked key and not itself blocked."""
    b = torch.zeros(n, dtype=torch.bool)
    b[block] = True
    idx = torch.arange(n)
    return b[None, :] & ~b[:, None] & (idx[:, None] > idx[None, :])


@torch.no_grad()
def reference_resid(lm, seq, probe, block=None, add=None, layers=None) -> np.ndarray:
    """[L, D] residual stream after each decoder layer at `probe`: one unpadded row, no cache."""
    model = lm.model
    seq = seq[: probe + 1]
    outs = []
    hooks = [
        layer.register_forward_hook(
            lambda _m, _a, o: outs.append((o[0] if isinstance(o, tuple) else o)[0, probe])
        )
        for layer in decoder_layers(model)
    ]
    before = model.config._attn_implementation
    model.set_attn_implementation(REF)
    _EDIT.update(block=None if block is None else block_cells(len(seq), block), add=add, layers=layers)
    try:
        model(input_ids=torch.tensor([seq]), use_cache=False)
    finally:
        _EDIT.clear()
        model.set_attn_implementation(before)
        for h in hooks:
            h.remove()
    return torch.stack(outs).float().numpy()


def _close(got, ref, rel=2e-5):
    scale = float(np.abs(ref).max())
    assert np.abs(np.asarray(got, np.float32) - ref).max() <= rel * scale, np.abs(got - ref).max() / scale


def test_reference_is_the_models_own_forward(twin):
    """The reference attention without edits is the model's own forward (sliding window included), and the
    window really matters on these sequences (else the tests below could not see it ignored)."""
    seq = _rand(3 * WINDOW, 1)
    with torch.no_grad():
        own = twin.model(torch.tensor([seq])).logits
        before = twin.model.config._attn_implementation
        twin.model.set_attn_implementation(REF)
        try:
            ref = twin.model(torch.tensor([seq])).logits
        finally:
            twin.model.set_attn_implementation(before)
    torch.testing.assert_close(ref, own, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ knockout (A7)
def _ko_case():
    seqs = [_rand(n, 10 + n) for n in (26, 21, 30)]
    probes = [25, 19, 29]
    # condition 0: keys far outside the probe's window; condition 1: keys inside it
    return seqs, probes, [[[1, 2, 3], [2], [4, 5]], [[20, 21], [15], [24]]]


@pytest.mark.parametrize("mode", ["cumulative", "window"])
def test_knockout_equals_masked_reference(twin, mode, monkeypatch):
    """The engine's knockout (full passes, padded batch) = the model's own passes with the same key cells
    blocked, in every layer (cumulative) or in each k's window of layers (window)."""
    monkeypatch.setattr(batches, "MIN_SHARED_PREFIX", 10**9)
    seqs, probes, block_sets = _ko_case()
    clean, kos = knockout_sweep(twin, seqs, probes, block_sets, 3, mode=mode, window=3)
    n_layers = twin.info["n_layers"]
    for i, (seq, p) in enumerate(zip(seqs, probes, strict=True)):
        _close(clean[i], reference_resid(twin, seq, p))
        for c, blocks in enumerate(block_sets):
            if mode == "cumulative":
                ref = reference_resid(twin, seq, p, blocks[i])
            else:
                windows = [set(passes.window_layers(k, 3, n_layers)) for k in range(n_layers)]
                ref = np.stack(
                    [reference_resid(twin, seq, p, blocks[i], layers=windows[k])[k] for k in range(n_layers)]
                )
            _close(kos[c][i], ref)
    assert np.abs(kos[1] - clean).max() > 1e-2 * np.abs(clean).max()  # the knockout does change the state
    # keys beyond the receptive field of the probe (window - 1 tokens per layer) change nothing at all
    reach = sum(w - 1 if w else 10**9 for w in layer_windows(twin.model.config))
    if all(max(b) < p - reach for b, p in zip(block_sets[0], probes, strict=True)):
        assert np.array_equal(kos[0], clean)


def _headed(n_head=10, lengths=(28, 24, 31)):
    head = _rand(n_head, 99)
    return [head + _rand(n - n_head, n) for n in lengths]


def test_knockout_from_a_prefix_cache_equals_reference(twin, monkeypatch):
    """Knockout passes that start from the clean prefix's cache (shared head run once, the prefix crossing
    the window) give the reference states."""
    seqs = _headed()
    probes = [len(s) - 1 for s in seqs]
    block_sets = [[[13, 14], [12], [15, 16]], [[18], [14, 15], [20]]]
    conds = [Condition(block=b) for b in block_sets]
    assert passes.first_change(conds, [0, 1, 2], seqs) == 12 > WINDOW
    calls = []
    real = passes.head_cache
    monkeypatch.setattr(passes, "head_cache", lambda *a: calls.append(a[2]) or real(*a))
    clean, kos = knockout_sweep(twin, seqs, probes, block_sets, 3)
    assert calls == [10]  # the prefix cache path ran, from the shared head
    for i, (seq, p) in enumerate(zip(seqs, probes, strict=True)):
        _close(clean[i], reference_resid(twin, seq, p))
        for c, blocks in enumerate(block_sets):
            _close(kos[c][i], reference_resid(twin, seq, p, blocks[i]))


def test_conditions_from_a_shared_prefix_equal_reference(twin):
    """Token patching and Pathway Reweighting at layer K, run from the shared prefix's cache: the reference
    passes on the patched tokens, and with log(factor) added on the reweighted edges."""
    seqs = _headed()
    probes = [len(s) - 2 for s in seqs]
    eq = [[12, 13], [11], [14, 15]]
    answer = [list(range(p - 4, p + 1)) for p in probes]
    patched = [interventions.patch(s, e, [FIRST_BYTE + 7] * len(e)) for s, e in zip(seqs, eq, strict=True)]
    conds = [Condition(tokens=patched), Condition(edges=(answer, eq), factor=3.0)]
    k = 2
    outs = [np.zeros((3, twin.info["hidden_size"]), np.float32) for _ in conds]
    got = resid_states(twin, seqs, probes, conds, 3, layer=k, out=outs)
    for i, (seq, p) in enumerate(zip(seqs, probes, strict=True)):
        _close(got[0][i], reference_resid(twin, patched[i], p)[k - 1])
        add = torch.zeros(p + 1, p + 1)
        for q in answer[i]:
            add[q, eq[i]] = float(np.log(3.0))
        _close(got[1][i], reference_resid(twin, seq, p, add=add)[k - 1])


# ------------------------------------------------------------------ shared head: detection baselines (A17)
def test_answer_logprobs_and_p_true_equal_the_models_own_logits(twin, monkeypatch):
    """Logits-mean/min and P(True) with the shared head run once equal the model's own (soft-capped) full
    logits, row by row."""
    seqs = _headed()
    ea = [[22, 23, 24], [15], [20, 30]]
    calls = []
    real = passes.head_cache
    monkeypatch.setattr(passes, "head_cache", lambda *a: calls.append(a[2]) or real(*a))
    mean, low = answer_logprobs(twin, seqs, ea, batch_size=3)
    pt = interventions.p_true(twin, seqs, batch_size=3)
    assert calls == [10, 10]
    t_ids, f_ids = interventions.verdict_token_ids(twin.tokenizer)
    with torch.no_grad():
        for i, s in enumerate(seqs):
            logits = twin.model(torch.tensor([s])).logits[0].float()  # the model applies its soft-cap
            lp = torch.log_softmax(logits, -1)
            vals = np.array([lp[p - 1, s[p]].item() for p in ea[i]])
            assert mean[i] == pytest.approx(vals.mean(), abs=1e-5)
            assert low[i] == pytest.approx(vals.min(), abs=1e-5)
            lt, lf = torch.logsumexp(logits[-1, t_ids], 0), torch.logsumexp(logits[-1, f_ids], 0)
            assert pt[i] == pytest.approx(torch.sigmoid(lt - lf).item(), abs=1e-5)


# ------------------------------------------------------------------ saliency (Fig. 1)
def _sal_case():
    seqs = _headed(lengths=(27, 22, 30))
    starts = [20, 16, 21]
    eqs = [[11, 12, 13], [10, 14], [12]]
    eas = [[21, 22], [17], [25, 26, 27]]
    return seqs, starts, eqs, eas


def test_saliency_loss_is_the_answer_nll(twin):
    """The saliency loss (LM head on the scored positions only, soft-cap applied by the stage) equals the
    summed mean answer NLL of the model's own logits, with and without the shared head."""
    seqs, starts, _, _ = _sal_case()
    expected = 0.0
    with torch.no_grad():
        for seq, s in zip(seqs, starts, strict=True):
            lp = torch.log_softmax(twin.model(torch.tensor([seq])).logits[0].double(), -1)
            expected += -float(np.mean([lp[t - 1, seq[t]].item() for t in range(s, len(seq))]))
    with backend.gradient_mode(twin.model):
        for head in (0, 10):
            loss, attns, grads, valid, _ = passes.attention_and_grads(twin, seqs, starts, head)
            assert float(loss) == pytest.approx(expected, rel=1e-5)
            assert attns[0].shape[-2:] == (valid.shape[1] - head, valid.shape[1])


def test_saliency_shared_head_batched_equals_single_full_passes(twin, monkeypatch):
    seqs, starts, eqs, eas = _sal_case()
    shared = saliency.saliency(twin, seqs, starts, eqs, eas, batch_size=3).scores
    monkeypatch.setattr(batches, "MIN_SHARED_PREFIX", 10**9)
    single = np.concatenate(
        [
            saliency.saliency(twin, [s], [a], [q], [e], 1).scores
            for s, a, q, e in zip(*_sal_case(), strict=True)
        ]
    )
    # full-attention layers see every edge; a sliding layer's S is 0 where the cells lie beyond its window
    full = np.array([w is None for w in layer_windows(twin.model.config)])
    assert np.isfinite(single).all() and (single[:, full] > 0).all() and (single[:, ~full] >= 0).all()
    assert (single > 0).mean() >= 0.5
    np.testing.assert_allclose(shared, single, rtol=1e-4, atol=1e-9)


def test_saliency_pass_gives_the_separate_logits_baseline(twin):
    """The workflow reads Logits-mean/min (A17) off the saliency pass (eager attention, whole sequences,
    batches of saliency_batch_size, the shared head run once) instead of a clean pass of their own: row by
    row they equal `answer_logprobs`' separate pass, and the model's own (soft-capped) logits."""
    seqs, starts, eqs, eas = _sal_case()
    eas = [*eas[:2], []]  # a sample without E_A tokens: NaN, as in the separate pass
    got = saliency.saliency(twin, seqs, starts, eqs, eas, batch_size=2)
    mean, low = answer_logprobs(twin, seqs, eas, batch_size=3)
    assert np.isnan(got.logit_mean[2]) and np.isnan(mean[2]) and np.isfinite(got.logit_min[:2]).all()
    np.testing.assert_allclose(got.logit_mean, mean, rtol=1e-5, atol=1e-6, equal_nan=True)
    np.testing.assert_allclose(got.logit_min, low, rtol=1e-5, atol=1e-6, equal_nan=True)
    with torch.no_grad():
        for i in range(2):
            lp = torch.log_softmax(twin.model(torch.tensor([seqs[i]])).logits[0].double(), -1)
            vals = [lp[p - 1, seqs[i][p]].item() for p in eas[i]]
            assert got.logit_mean[i] == pytest.approx(np.mean(vals), abs=1e-5)
            assert got.logit_min[i] == pytest.approx(np.min(vals), abs=1e-5)


def _plain_states(lm, seq: list[int], probe: int) -> np.ndarray:
    """[L, D] float32: one plain forward pass of one row cut at the probe (no padding, no cache, the
    model's own attention implementation), its hidden states after each decoder layer at the probe; the
    final norm, which the last of them carries, left out (the states are the residual stream before it)."""
    base = getattr(lm.model, lm.model.base_model_prefix)
    norm, base.norm = base.norm, torch.nn.Identity()
    try:
        with torch.no_grad():
            out = base(input_ids=torch.tensor([seq[: probe + 1]]), output_hidden_states=True, use_cache=False)
    finally:
        base.norm = norm
    return torch.stack([h[0, probe] for h in out.hidden_states[1:]]).float().numpy()


def test_knockout_stage_takes_its_clean_states_from_its_own_engine_run(twin):
    """extract_pathways' resid_clean is a clean condition of the knockouts' own engine run (the model's
    attention, sequences cut at the probe, the shared-prefix cache), no longer states off the saliency pass
    (eager attention with gradients, whole sequences), so a ΔP compares states of one kernel: equal to a
    plain forward pass of each row at every layer, across the sliding window, and bit for bit to the clean
    condition of an engine run beside the same knockouts. The saliency pass takes nowhere to write states."""
    import inspect

    import polars as pl

    from truthflow.engine import AttnGrad
    from truthflow.pathways import activations, extract

    seqs, starts, eqs, eas = _sal_case()
    probes = [e[-1] for e in eas]
    n = len(seqs)
    kept = pl.DataFrame(
        {
            "id": [f"q{i}" for i in range(n)],
            "correct": [True, False, True],
            "refusal": [False] * n,
            "seq": seqs,
            "answer_start": starts,
            "eq_positions": eqs,
            "ea_positions": eas,
            "probe_position": probes,
            "question_positions": [list(range(10, 16))] * n,
            "eq_text": ["x"] * n,
            "ea_text": ["y"] * n,
        },
        schema=extract.LOCATED_SCHEMA,
    )
    cfg = {
        "target": "exact_question",
        "control_draws": 1,
        "control_seed": 0,
        "mode": "cumulative",
        "window": 9,
    }
    shapes = activations.resid_shapes(n, twin.info["n_layers"], twin.info["hidden_size"], 1)
    out = activations.knockout_out(*(np.full(s, np.nan, np.float32) for s in shapes.values()))
    samples, _ = extract.knockout_states(twin, kept, 2, cfg, 2, "knockout twin/popqa", out)
    clean = out[0]
    for i in range(n):
        want = _plain_states(twin, seqs[i], probes[i])
        np.testing.assert_allclose(clean[i], want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    blocks = [samples["blocked_positions"].to_list(), [c[0] for c in samples["control_positions"].to_list()]]
    conds = [Condition(), *(Condition(block=b) for b in blocks)]
    fresh = [np.zeros(shapes["resid_clean"], np.float32) for _ in conds]
    same = resid_states(twin, seqs, probes, conds, 2, out=fresh)
    assert np.array_equal(clean, same[0]) and not np.allclose(out[1][0], clean)
    assert "states" not in inspect.signature(saliency.saliency).parameters
    assert "states" not in inspect.signature(AttnGrad).parameters


# ------------------------------------------------------------------ MIN-K% (B1)
TEXTS = [
    "What is a proton gradient and why does it matter?",
    "xy",
    "Why does the Central Limit Theorem need independence of the samples?",
    "Hi there, friend.",
]


def test_mink_equals_direct_log_softmax(twin):
    k_grid = [10, 20, 50]
    table = score_texts(twin, TEXTS, k_grid, batch_size=4, desc="test")
    for i, text in enumerate(TEXTS):
        expected = reference_scores(twin, text, k_grid)
        got = table.row(i, named=True)
        for col, value in expected.items():
            assert got[col] == pytest.approx(value, rel=1e-4, abs=1e-5), (text, col)


# ------------------------------------------------------------------ generation (A1)
QUESTIONS = [
    "What is the capital of France?",
    "Who wrote Hamlet?",
    "How many legs does a spider have?",
    "Who painted the Mona Lisa?",
]


def _greedy_row(lm, ids, max_new, stops):
    with torch.inference_mode():
        out = lm.model.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=max_new,
            do_sample=False,
            top_p=None,
            top_k=None,
            temperature=None,
            pad_token_id=0,
            eos_token_id=sorted(stops),
            disable_compile=True,
        )[0, len(ids) :].tolist()
    cut = next((k for k, t in enumerate(out) if t in stops), len(out))
    return strip_think(lm.tokenizer, out[:cut])[0]


@pytest.mark.parametrize("chat", [True, False])
def test_batched_generation_equals_per_row_greedy(twin, chat):
    """Batched, left-padded generation (chat prompts: the shared head prefilled once) gives each row's own
    greedy HF generate, prompts and answers crossing the window."""
    prompts = [build_prompt(twin.tokenizer, q, chat) for q in QUESTIONS]
    encoded = [encode_prompt(twin.tokenizer, p, chat) for p in prompts]
    assert min(map(len, encoded)) > WINDOW
    assert (batches.shared_head(encoded, 10**6) > 0) == chat
    got = generate_answers(twin, prompts, 4, 12, stop_at_newline=not chat, chat=chat)
    stops = eos_token_ids(twin.tokenizer, twin.model)
    if not chat:
        stops |= set(newline_token_ids(twin.tokenizer))
    for g, ids in zip(got, encoded, strict=True):
        assert g["prompt_ids"] == ids
        assert g["answer_ids"] == _greedy_row(twin, ids, 12, stops)
    assert sum(g["n_new_tokens"] for g in got) > 0


# ------------------------------------------------------------------ OOM back-off
class _OomOnce:
    """Raise a CUDA out-of-memory error from inside the model's first forward (its embedding), once."""

    def __init__(self, model):
        self.fired = 0
        self.handle = model.get_input_embeddings().register_forward_pre_hook(self)

    def __call__(self, *_):
        if not self.fired:
            self.fired += 1
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")


def test_oom_back_off_gives_the_unbatched_results(twin):
    """An OOM in the first batch's forward halves the batch; every stage's results then equal batch-1 runs."""

    def with_oom(fn, *args):
        oom = _OomOnce(twin.model)
        try:
            out = fn(*args)
        finally:
            oom.handle.remove()
        assert oom.fired == 1
        return out

    seqs, probes, block_sets = _ko_case()
    ea = [[22, 23], [15], [20, 28]]
    s_seqs, starts, eqs, eas = _sal_case()
    prompts = [build_prompt(twin.tokenizer, q, True) for q in QUESTIONS]
    runs = {
        "knockout": lambda b: knockout_sweep(twin, seqs, probes, block_sets, b),
        "logprobs": lambda b: answer_logprobs(twin, seqs, ea, b),
        "saliency": lambda b: saliency.saliency(twin, s_seqs, starts, eqs, eas, b),
        "mink": lambda b: score_texts(twin, TEXTS, [20], b).to_numpy(),
        "generate": lambda b: [g["answer_ids"] for g in generate_answers(twin, prompts, b, 6, False, True)],
    }
    for name, run in runs.items():
        backed_off = with_oom(run, 4)
        single = run(1)
        for a, b in zip(_flat(backed_off), _flat(single), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=name)


def _flat(x):
    if isinstance(x, (tuple, list)) and x and not isinstance(x[0], int):
        return [y for item in x for y in _flat(item)]
    return [np.asarray(x, dtype=np.float64)]


# ------------------------------------------------------------------ the twins themselves
def test_saved_twin_is_a_model_directory(twin, tmp_path):
    """save_twin writes what prepare_model (local source) and load_model read: the same weights, tokenizer,
    chat template and stop ids; a real tokenizer (byte-level, round trip) whose vocabulary is the model's."""
    arch = twin.info["key"]["twin"]
    src = save_twin(arch, tmp_path / "src")
    info = prepare_model("t", {"source": {"local": str(src)}}, tmp_path / "models" / "t")
    assert info["n_layers"] == twin.info["n_layers"] and info["model_type"] == twin.info["model_type"]
    lm = load_model(tmp_path / "models" / "t", "float32")
    ids = torch.tensor([_rand(3 * WINDOW, 5)])
    with torch.no_grad():
        assert torch.equal(lm.model(ids).logits, twin.model(ids).logits)
    assert lm.tokenizer.chat_template == twin.tokenizer.chat_template
    assert eos_token_ids(lm.tokenizer, lm.model) == eos_token_ids(twin.tokenizer, twin.model)
    text = "Q: Who wrote Hamlet?\nA: Shakespeare"
    enc = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert lm.tokenizer.decode(enc) == text and len(enc) == len(text)
    assert len(twin.tokenizer) == twin.model.config.vocab_size
    cfg = twin.model.config
    assert bool(cfg.tie_word_embeddings) == (arch in ("gemma3", "qwen3"))
    if arch == "gemma3":
        assert cfg.final_logit_softcapping and cfg.attn_logit_softcapping and cfg.sliding_window == WINDOW
        assert set(cfg.layer_types) == {"sliding_attention", "full_attention"}
    if arch == "qwen3":  # enable_thinking opens a reasoning block; False writes an empty one (Qwen3's own)
        think = build_prompt(lm.tokenizer, "Who?", True)
        plain = build_prompt(lm.tokenizer, "Who?", True, chat_template_kwargs={"enable_thinking": False})
        assert think.endswith("<think>\n") and plain.endswith("<think>\n\n</think>\n\n")
