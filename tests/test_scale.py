"""Memory stays bounded by streaming: the extraction's host memory does not grow with the number of samples
(residual streams go to memory-mapped files batch by batch). Measured with tracemalloc, which sees every
numpy allocation on the host, on a tiny random-weight Llama, so the test is fast and exact."""

from __future__ import annotations

import tracemalloc

import numpy as np
import torch
from conftest import resid_states

from truthflow.engine import Condition
from truthflow.models import LoadedModel


def _tiny_model():
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "llama",
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=500,
        max_position_embeddings=64,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()

    class Tok:
        pad_token_id = 0

    return LoadedModel(model=model, tokenizer=Tok(), info={"n_layers": 4, "hidden_size": 256}, device="cpu")


def _peak_host_bytes(lm, n: int, tmp_path) -> int:
    rng = np.random.default_rng(0)
    seqs = [rng.integers(3, 500, size=16).tolist() for _ in range(n)]
    probe = [15] * n
    blocks = [[2, 3]] * n
    shape = (n, 4, 256)
    clean = np.lib.format.open_memmap(tmp_path / f"c{n}.npy", mode="w+", dtype=np.float16, shape=shape)
    kos = [
        np.lib.format.open_memmap(tmp_path / f"k{n}_{c}.npy", mode="w+", dtype=np.float16, shape=shape)
        for c in range(4)
    ]
    tracemalloc.start()
    try:
        conds = [Condition(), *[Condition(block=blocks)] * 4]
        resid_states(lm, seqs, probe, conds, 32, out=[clean, *kos], desc="scale")
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_extraction_host_memory_is_flat_in_n(tmp_path):
    lm = _tiny_model()
    small, large = _peak_host_bytes(lm, 32, tmp_path), _peak_host_bytes(lm, 512, tmp_path)
    # held in memory, 512 samples' five [n, 4, 256] float16 arrays would add ~5 MB over 32 samples'
    full_arrays = 5 * (512 - 32) * 4 * 256 * 2
    assert large - small < full_arrays / 10, (small, large)
