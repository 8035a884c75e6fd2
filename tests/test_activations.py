"""The activation files: what a writer lays out, the reader takes back, a file of another shape fails with
the samples table it has to match, and each model's files store the dtype it computes in."""

import numpy as np
import polars as pl
import pytest
import torch

from truthflow.errors import TruthflowError
from truthflow.pathways import activations, extract


def _paths(tmp_path, names) -> dict[str, str]:
    return {k: str(tmp_path / f"{k}.npy") for k in names}


COMPUTE = ("float32", "float16", "bfloat16")
STORED = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}  # bfloat16: its bit patterns


@pytest.mark.parametrize("compute", COMPUTE)
def test_resid_files_round_trip(tmp_path, compute):
    paths = _paths(tmp_path, activations.RESID)
    shapes = activations.resid_shapes(4, 3, 8, 2)
    assert shapes == {"resid_clean": (4, 3, 8), "resid_ko": (4, 3, 8), "resid_control": (2, 4, 3, 8)}
    with activations.written(paths, shapes, compute) as resid:
        clean, ko = activations.knockout_out(*resid)
        assert len(ko) == 3 and all(a.shape == (4, 3, 8) for a in ko)
        clean[:] = 1
        ko[2][:] = 3  # control draw 1
    assert [np.load(p).dtype for p in paths.values()] == [STORED[compute]] * 3
    got = [np.asarray(a, dtype=np.float32) for a in activations.read_resid(paths, 4, "samples.parquet")]
    assert got[0].min() == 1 and got[2][1].min() == 3 and got[2][0].max() == 0
    (only,) = activations.read_resid(paths, 4, "samples.parquet", names=["resid_clean"])
    assert only.shape == (4, 3, 8)
    with pytest.raises(TruthflowError, match="one row per sample of samples.parquet"):
        activations.read_resid(paths, 5, "samples.parquet")


@pytest.mark.parametrize("compute", COMPUTE)
def test_experiment_files_round_trip(tmp_path, compute):
    paths = _paths(tmp_path, activations.EXPERIMENT)
    shapes = activations.experiment_shapes(4, 8, 2)
    assert shapes == {"patch": (2, 4, 8), "answer_only": (4, 8), "pr": (4, 4, 8)}
    with activations.written(paths, shapes, compute) as (_, _, pr):
        pr[:] = np.arange(4)[:, None, None]
    assert [np.load(p).dtype for p in paths.values()] == [STORED[compute]] * 3
    patch, answer_only, pr = activations.read_experiment(paths, 4, 8, 2, "samples.parquet")
    pairs = activations.pr_pairs(pr, [2, 4])
    assert [(float(up[0, 0]), float(down[0, 0])) for up, down in pairs.values()] == [(0, 1), (2, 3)]
    with pytest.raises(TruthflowError, match="expected"):
        activations.read_experiment(paths, 4, 8, 3, "samples.parquet")


def test_bfloat16_files_hold_what_torch_rounds_to_and_read_back_float32(tmp_path):
    """A bf16 model's states: stored as the bit patterns torch's own bf16 conversion gives (ties to even,
    values past float16's 65,504 and below its smallest normal kept), read back as float32, exactly those
    bf16 values; a layer read is a float32 array of that layer alone."""
    rng = np.random.default_rng(0)
    values = (rng.standard_normal((4, 3, 8)) * 10.0 ** rng.integers(-8, 8, (4, 3, 8))).astype(np.float32)
    values[0, 0, :3] = [65_840.0, -3.0e38, 1.00390625]  # Gemma-3's |x|, near float32's max, a tie
    as_bf16 = torch.from_numpy(values).to(torch.bfloat16)
    paths = _paths(tmp_path, activations.RESID)
    with activations.written(paths, activations.resid_shapes(4, 3, 8, 1), torch.bfloat16) as resid:
        clean, _ = activations.knockout_out(*resid)
        clean[:] = values
    stored = np.load(paths["resid_clean"])  # layer-major
    bits = as_bf16.view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(stored, bits.transpose(1, 0, 2))
    (seen,) = activations.read_resid(paths, 4, "samples.parquet", names=["resid_clean"])
    assert seen.dtype == np.float32 and seen.shape == (4, 3, 8)
    np.testing.assert_array_equal(np.asarray(seen), as_bf16.float().numpy())
    layer = np.asarray(seen[:, 1], dtype=np.float32)
    assert layer.shape == (4, 8) and layer[0, 0] == as_bf16[0, 1, 0].item()
    assert (
        seen[0, 0, 0] == 66_048.0
    )  # 65,840 to bf16's 8 bits (steps of 512 there): finite, not float16's inf


def test_a_state_file_of_another_dtype_fails_with_its_path(tmp_path):
    """A file of a dtype no model's storage has (float64, int32), or a resid_ko of another dtype than its
    resid_clean, is refused naming the file."""
    paths = _paths(tmp_path, activations.RESID)
    with activations.written(paths, activations.resid_shapes(4, 3, 8, 1)) as _:
        pass
    np.save(paths["resid_ko"], np.zeros((3, 4, 8), np.float16))
    with pytest.raises(TruthflowError, match="resid_ko.npy.*expected \\[3, 4, 8\\] float32"):
        activations.read_resid(paths, 4, "samples.parquet")
    np.save(paths["resid_clean"], np.zeros((3, 4, 8), np.float64))
    with pytest.raises(TruthflowError, match="resid_clean.npy.*dtype float64, expected one of float32"):
        activations.read_resid(paths, 4, "samples.parquet")


def test_resid_files_are_stored_layer_major(tmp_path):
    """One layer of a resid file is one contiguous block on disk: the probes read a layer in one go."""
    paths = _paths(tmp_path, activations.RESID)
    with activations.written(paths, activations.resid_shapes(4, 3, 8, 2)) as resid:
        clean, ko = activations.knockout_out(*resid)
        clean[:, 1] = 7  # layer 2 of every sample, written through the [N, L, D] view
        ko[1][2, 0] = 5  # control draw 0, sample 3, layer 1
    stored_clean = np.load(paths["resid_clean"])
    stored_control = np.load(paths["resid_control"])
    assert stored_clean.shape == (3, 4, 8) and stored_control.shape == (2, 3, 4, 8)
    assert (stored_clean[1] == 7).all() and (stored_clean[[0, 2]] == 0).all()
    assert stored_control[0, 0, 2].max() == 5 and stored_control.sum() == 5 * 8
    (clean_seen,) = activations.read_resid(paths, 4, "samples.parquet", names=["resid_clean"])
    layer = clean_seen[:, 1]
    assert layer.stored.flags["C_CONTIGUOUS"] and layer.shape == (4, 8)


KNOCKOUT = {
    "target": "exact_question",
    "control_draws": 1,
    "control_seed": 0,
    "mode": "cumulative",
    "window": 9,
}


def _located(n: int = 4, seed: int = 0) -> pl.DataFrame:
    """`extract.locate_spans`' table for n random sequences of a twin's stand-in vocabulary: the question is
    positions 1..a-2, E_Q two of its tokens, the answer (E_A) the last four, the probe the last token."""
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(3, 200, int(m)).tolist() for m in rng.integers(14, 21, n)]
    starts = [len(s) - 4 for s in seqs]
    return pl.DataFrame(
        {
            "id": [f"q{i}" for i in range(n)],
            "correct": [i % 2 == 0 for i in range(n)],
            "refusal": [False] * n,
            "seq": seqs,
            "answer_start": starts,
            "eq_positions": [[2, 4]] * n,
            "ea_positions": [list(range(a, len(s))) for a, s in zip(starts, seqs, strict=True)],
            "probe_position": [len(s) - 1 for s in seqs],
            "question_positions": [list(range(1, a - 1)) for a in starts],
            "eq_text": ["x"] * n,
            "ea_text": ["y"] * n,
        },
        schema=extract.LOCATED_SCHEMA,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_residual_stream_past_float16s_range_is_stored_and_read_back(tmp_path, dtype):
    """A Gemma-3 twin whose residual stream passes float16's 65,504 (a layer's MLP output scaled, as Gemma-3
    270M's reaches 65,840): the knockout stage writes its states into files of the dtype it computes in and
    the reader gives back what it computed: float32 exactly, bfloat16 its own bf16 values. Before: float16
    storage stopped the stage ("overflows float16 storage ... needs float32 storage")."""
    from truthflow.twins import build_twin

    lm = build_twin("gemma3", dtype=dtype)
    with torch.no_grad():
        lm.model.model.layers[1].post_feedforward_layernorm.weight.fill_(1e5)
    kept = _located()
    n, layers, hidden = kept.height, lm.info["n_layers"], lm.info["hidden_size"]
    shapes = activations.resid_shapes(n, layers, hidden, KNOCKOUT["control_draws"])
    paths = _paths(tmp_path, activations.RESID)
    with activations.written(paths, shapes, lm.model.dtype) as resid:
        extract.knockout_states(
            lm, kept, 4, KNOCKOUT, 4, "knockout twin/popqa", activations.knockout_out(*resid)
        )
    assert np.load(paths["resid_clean"], mmap_mode="r").dtype == STORED[str(dtype).removeprefix("torch.")]
    # the same stage into float32 arrays in memory: the values the model computed, as the engine hands them
    memory = activations.knockout_out(*(np.zeros(s, np.float32) for s in shapes.values()))
    extract.knockout_states(lm, kept, 4, KNOCKOUT, 4, "knockout twin/popqa", memory)
    files = activations.read_resid(paths, n, "samples.parquet")
    computed = [memory[0], memory[1][0], np.stack(memory[1][1:])]
    for got, want in zip(files, computed, strict=True):
        assert np.abs(want).max() > 65_504 and np.isfinite(want).all()
        np.testing.assert_array_equal(np.asarray(got, dtype=np.float32), want)
    if dtype == torch.bfloat16:  # values a bf16 model computes are bf16 values: stored without rounding
        np.testing.assert_array_equal(torch.from_numpy(memory[0]).to(dtype).float().numpy(), memory[0])
