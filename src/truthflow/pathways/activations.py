"""The activation files of one (model, dataset), the one place that knows their names, shapes and dtype: the
residual stream after every layer at the probe position (resid_*.npy, from extract_pathways) and the new
states at layer K (exp_*.npy, from extract_experiments). float16 .npy, memory-mapped both ways (written batch
by batch, read one layer at a time), so memory stays bounded in N and L. N samples (samples.parquet's rows,
in order), L layers, D the hidden size, C control draws, F the reweighting factors."""

from collections.abc import Mapping
from contextlib import contextmanager

import numpy as np

from .. import validate

DTYPE = np.float16
# resid_clean [N, L, D]; resid_ko [N, L, D], the target knockout; resid_control [C, N, L, D]
RESID = ("resid_clean", "resid_ko", "resid_control")
# patch [2, N, D]: E_Q, then the control, patched; answer_only [N, D]; pr [2F, N, D]: ×f, then ×1/f, per f
EXPERIMENT = ("patch", "answer_only", "pr")


def resid_shapes(n: int, n_layers: int, hidden: int, control_draws: int) -> dict[str, tuple[int, ...]]:
    state = (n, n_layers, hidden)
    return dict(zip(RESID, (state, state, (control_draws, *state)), strict=True))


def experiment_shapes(n: int, hidden: int, n_factors: int) -> dict[str, tuple[int, ...]]:
    return dict(zip(EXPERIMENT, ((2, n, hidden), (n, hidden), (2 * n_factors, n, hidden)), strict=True))


@contextmanager
def written(paths: Mapping[str, str], shapes: Mapping[str, tuple[int, ...]]):
    """Empty files of `shapes` at paths[name], memory-mapped for writing (in the order of shapes) and
    flushed on leaving."""
    arrays = [np.lib.format.open_memmap(paths[k], mode="w+", dtype=DTYPE, shape=s) for k, s in shapes.items()]
    yield arrays
    for arr in arrays:
        arr.flush()


def knockout_out(clean, ko, control) -> tuple:
    """The layout `extract.knockout_states` writes into: (resid_clean, [resid_ko, control draw 0, ...])."""
    return clean, [ko, *(control[d] for d in range(len(control)))]


def _read(path, shape, samples_path) -> np.ndarray:
    return validate.load_npy(path, shape, DTYPE, why=f", one row per sample of {samples_path}")


def read_resid(paths: Mapping[str, str], n: int, samples_path, names=RESID) -> list[np.ndarray]:
    """The resid files `names` (resid_clean first), memory-mapped; their shapes checked against the N rows
    of samples_path and resid_clean's L and D."""
    clean = _read(paths["resid_clean"], (n, None, None), samples_path)
    shapes = resid_shapes(n, clean.shape[1], clean.shape[2], None)
    return [clean, *(_read(paths[k], shapes[k], samples_path) for k in names if k != "resid_clean")]


def read_experiment(paths: Mapping[str, str], n: int, hidden: int, n_factors: int, samples_path) -> list:
    """patch, answer_only, pr, memory-mapped; shapes checked."""
    shapes = experiment_shapes(n, hidden, n_factors)
    return [_read(paths[k], s, samples_path) for k, s in shapes.items()]


def pr_pairs(pr, factors) -> dict[float, tuple[np.ndarray, np.ndarray]]:
    """factor f -> (the ×f states, the ×1/f states) of a pr array."""
    return {float(f): (pr[2 * i], pr[2 * i + 1]) for i, f in enumerate(factors)}
