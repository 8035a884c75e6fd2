"""score_texts on a real model equals an unbatched per-text computation in plain torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from truthflow.depth.mink import min_k_percent, min_k_plus_plus, mink_column, score_texts

TEXTS = [
    "What are thylakoids?",
    "Why",
    "How does the proton gradient across the thylakoid membrane drive ATP synthesis in chloroplasts?",
    "What is the Central Limit Theorem, and why does it need the samples to be independent?",
    "Explain opportunity cost.",
]
K_GRID = [10, 20, 30]


@pytest.mark.model
def test_score_texts_equals_unbatched_forward(smollm) -> None:
    from truthflow.depth.mink import encode_for_scoring

    lm = smollm
    table = score_texts(lm, TEXTS, K_GRID, batch_size=3)
    for i, text in enumerate(TEXTS):
        ids = encode_for_scoring(lm.tokenizer, text)
        assert ids[0] == lm.tokenizer.bos_token_id or lm.tokenizer.bos_token_id is None
        with torch.no_grad():
            logits = lm.model(torch.tensor([ids], device=lm.device)).logits[0, :-1].double().cpu()
        logp = torch.log_softmax(logits, -1)
        target = torch.tensor(ids[1:])
        token_logp = logp[torch.arange(len(target)), target].numpy()
        p = logp.exp()
        mu = (p * logp).sum(-1)
        sigma = ((p * logp**2).sum(-1) - mu**2).clamp_min(0).sqrt()
        row = table.row(i, named=True)
        assert row["n_tokens"] == len(ids) - 1
        for k in K_GRID:
            assert row[mink_column(k)] == pytest.approx(min_k_percent(token_logp, k), rel=1e-4, abs=1e-4)
            expected_pp = min_k_plus_plus(token_logp, mu.numpy(), sigma.numpy(), k)
            assert row[mink_column(k, True)] == pytest.approx(expected_pp, rel=1e-4, abs=1e-4)
        assert np.isfinite(list(row.values())[2:]).all()
