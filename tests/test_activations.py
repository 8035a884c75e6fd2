"""The activation files: what a writer lays out, the reader takes back, and a file of another shape fails with
the samples table it has to match."""

import numpy as np
import pytest

from truthflow.errors import TruthflowError
from truthflow.pathways import activations


def _paths(tmp_path, names) -> dict[str, str]:
    return {k: str(tmp_path / f"{k}.npy") for k in names}


def test_resid_files_round_trip(tmp_path):
    paths = _paths(tmp_path, activations.RESID)
    shapes = activations.resid_shapes(4, 3, 8, 2)
    assert shapes == {"resid_clean": (4, 3, 8), "resid_ko": (4, 3, 8), "resid_control": (2, 4, 3, 8)}
    with activations.written(paths, shapes) as resid:
        clean, ko = activations.knockout_out(*resid)
        assert len(ko) == 3 and all(a.shape == (4, 3, 8) for a in ko)
        clean[:] = 1
        ko[2][:] = 3  # control draw 1
    got = activations.read_resid(paths, 4, "samples.parquet")
    assert [a.dtype for a in got] == [np.float16] * 3
    assert got[0].min() == 1 and got[2][1].min() == 3 and got[2][0].max() == 0
    (only,) = activations.read_resid(paths, 4, "samples.parquet", names=["resid_clean"])
    assert only.shape == (4, 3, 8)
    with pytest.raises(TruthflowError, match="one row per sample of samples.parquet"):
        activations.read_resid(paths, 5, "samples.parquet")


def test_experiment_files_round_trip(tmp_path):
    paths = _paths(tmp_path, activations.EXPERIMENT)
    shapes = activations.experiment_shapes(4, 8, 2)
    assert shapes == {"patch": (2, 4, 8), "answer_only": (4, 8), "pr": (4, 4, 8)}
    with activations.written(paths, shapes) as (_, _, pr):
        pr[:] = np.arange(4)[:, None, None]
    patch, answer_only, pr = activations.read_experiment(paths, 4, 8, 2, "samples.parquet")
    pairs = activations.pr_pairs(pr, [2, 4])
    assert [(float(up[0, 0]), float(down[0, 0])) for up, down in pairs.values()] == [(0, 1), (2, 3)]
    with pytest.raises(TruthflowError, match="expected"):
        activations.read_experiment(paths, 4, 8, 3, "samples.parquet")


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
    assert layer.flags["C_CONTIGUOUS"] and layer.shape == (4, 8)
