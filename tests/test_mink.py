"""MIN-K% and Min-K%++ (METHOD B1) against hand-computed cases; score_texts against a direct computation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import small_config

from truthflow.config import check_schema
from truthflow.depth.mink import (
    encode_for_scoring,
    min_k_percent,
    min_k_plus_plus,
    n_lowest,
    score_texts,
    token_moments,
)
from truthflow.depth.tables import k_label, mink_column
from truthflow.errors import TruthflowError
from truthflow.models import LoadedModel

LOGP = np.array([-1.0, -2.0, -3.0, -4.0, -5.0])


@pytest.mark.parametrize(
    ("k", "expected"),
    [
        (10, 5.0),  # ⌈0.5⌉ = 1 token: the lowest alone
        (20, 5.0),  # ⌈1⌉ = 1
        (40, 4.5),  # ⌈2⌉ = 2: −mean(−5, −4)
        (50, 4.0),  # ⌈2.5⌉ = 3: −mean(−5, −4, −3)
        (100, 3.0),  # all five
    ],
)
def test_min_k_percent_hand_cases(k: float, expected: float) -> None:
    assert min_k_percent(LOGP, k) == pytest.approx(expected)


def test_min_k_percent_ignores_token_order() -> None:
    assert min_k_percent(LOGP[::-1], 40) == pytest.approx(4.5)


def test_k_share_has_no_float_noise() -> None:
    # 10 % of 30 is 3 tokens; 0.1 * 30 = 3.0000000000000004 would make it 4
    assert n_lowest(30, 10) == 3
    assert min_k_percent(-np.arange(1.0, 31.0), 10) == pytest.approx(29.0)  # −mean(−30, −29, −28)


def test_one_token_text() -> None:
    assert min_k_percent(np.array([-0.7]), 20) == pytest.approx(0.7)
    assert min_k_plus_plus(np.array([-0.7]), np.array([-0.2]), np.array([0.5]), 20) == pytest.approx(-1.0)


def test_negation_convention() -> None:
    likely, unlikely = np.array([-0.1, -0.2, -0.3]), np.array([-4.0, -6.0, -8.0])
    assert 0 < min_k_percent(likely, 20) < min_k_percent(unlikely, 20)


def test_min_k_plus_plus_hand_case() -> None:
    logp = np.array([-1.0, -2.0, -3.0])
    mu = np.array([-1.0, -1.0, -2.0])
    sigma = np.array([1.0, 2.0, 0.5])
    # z = (0, −0.5, −2): not negated
    assert min_k_plus_plus(logp, mu, sigma, 33) == pytest.approx(-2.0)  # ⌈0.99⌉ = 1
    assert min_k_plus_plus(logp, mu, sigma, 34) == pytest.approx(-1.25)  # ⌈1.02⌉ = 2
    assert min_k_plus_plus(logp, mu, sigma, 100) == pytest.approx(-2.5 / 3)


def test_min_k_plus_plus_zero_sigma_is_zero_z() -> None:
    assert min_k_plus_plus(np.array([0.0, -1.0]), np.array([0.0, -0.5]), np.array([0.0, 0.5]), 100) == (
        pytest.approx(-0.5)
    )


@pytest.mark.parametrize("k", [0, -5, 100.5])
def test_bad_k_is_a_user_error(k: float) -> None:
    with pytest.raises(TruthflowError, match="k="):
        min_k_percent(LOGP, k)


def test_an_empty_k_grid_is_refused_by_the_schema() -> None:
    cfg = small_config()
    cfg.setdefault("depth", {}).setdefault("mink", {})["k_grid"] = []
    with pytest.raises(TruthflowError, match=r"^depth\.mink\.k_grid: \[\] should be non-empty"):
        check_schema(cfg)


def test_column_names() -> None:
    assert mink_column(20) == "mink_20"
    assert mink_column(20.0, plus_plus=True) == "minkpp_20"
    assert k_label(12.5) == "12.5"


def test_token_moments_hand_case() -> None:
    # p = (3/4, 1/4, 0): a Bernoulli over log p values a = ln 3/4, b = ln 1/4 (the -inf logit has p = 0)
    logits = torch.tensor([[math.log(3.0), 0.0, float("-inf")]])
    token_logp, mu, sigma = token_moments(logits, torch.tensor([1])).tolist()
    a, b = math.log(0.75), math.log(0.25)
    assert token_logp[0] == pytest.approx(b, abs=1e-6)
    assert mu[0] == pytest.approx(0.75 * a + 0.25 * b, abs=1e-6)
    # sqrt(Σ p (log p)² − mu²) = sqrt(p (1 − p)) |a − b| for two outcomes
    assert sigma[0] == pytest.approx(math.sqrt(0.75 * 0.25) * abs(a - b), abs=1e-6)


# ---------------------------------------------------------------- score_texts on a tiny random model


class CharTokenizer:
    """Character-level stand-in that, like many tokenizers, does not add the BOS itself."""

    bos_token_id = 1
    pad_token_id = 0

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [2 + (ord(c) % 40) for c in text]}


@pytest.fixture(scope="module")
def tiny_lm() -> LoadedModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    model = LlamaForCausalLM(config).eval()
    return LoadedModel(model=model, tokenizer=CharTokenizer(), info={}, device="cpu")


def reference_scores(lm: LoadedModel, text: str, k_grid: list[float]) -> dict:
    """Unbatched, in float64, with the definition's own formula for sigma."""
    ids = encode_for_scoring(lm.tokenizer, text)
    with torch.no_grad():
        logits = lm.model(torch.tensor([ids])).logits[0, :-1].double()
    logp = torch.log_softmax(logits, -1)
    target = torch.tensor(ids[1:])
    token_logp = logp[torch.arange(len(target)), target].numpy()
    p = logp.exp()
    mu = (p * logp).sum(-1)
    sigma = ((p * logp**2).sum(-1) - mu**2).clamp_min(0).sqrt()
    row = {"n_tokens": len(target)}
    for k in k_grid:
        row[mink_column(k)] = min_k_percent(token_logp, k)
        row[mink_column(k, True)] = min_k_plus_plus(token_logp, mu.numpy(), sigma.numpy(), k)
    return row


TEXTS = [
    "What is a proton gradient?",
    "x",
    "Why does the Central Limit Theorem need independence?",
    "Hi there",
]


@pytest.mark.parametrize("fake_oom", [None, "1"])
def test_score_texts_equals_direct_computation(tiny_lm, monkeypatch, fake_oom) -> None:
    if fake_oom:  # the OOM back-off (batch 3 → 1) must not change any score
        monkeypatch.setenv("TRUTHFLOW_FAKE_OOM_ABOVE", fake_oom)
    k_grid = [10, 20, 50]
    table = score_texts(tiny_lm, TEXTS, k_grid, batch_size=3, desc="test")
    assert table.columns == [
        "n_tokens",
        "mink_10",
        "mink_20",
        "mink_50",
        "minkpp_10",
        "minkpp_20",
        "minkpp_50",
    ]
    assert table.height == len(TEXTS)  # in input order: row i is TEXTS[i] (checked below)
    for i, text in enumerate(TEXTS):
        expected = reference_scores(tiny_lm, text, k_grid)
        got = table.row(i, named=True)
        assert got["n_tokens"] == expected["n_tokens"] == len(text)
        for col, value in expected.items():
            assert got[col] == pytest.approx(value, rel=1e-4, abs=1e-5), (text, col)


def test_score_texts_rejects_a_text_with_nothing_to_score(tiny_lm) -> None:
    with pytest.raises(TruthflowError, match="#1"):
        score_texts(tiny_lm, ["fine", ""], [20], batch_size=2)
