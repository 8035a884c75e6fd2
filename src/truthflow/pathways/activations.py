"""The activation files of one (model, dataset), the one place that knows their names, shapes, layout and
dtype: the residual stream after every layer at the probe position (resid_*.npy, from extract_pathways) and
the new states at layer K (exp_*.npy, from extract_experiments). float16 .npy, memory-mapped both ways
(written batch by batch, read one layer at a time), so memory stays bounded in N and L. N samples
(samples.parquet's rows, in order), L layers, D the hidden size, C control draws, F the reweighting factors.

The resid files are stored layer-major ([L, N, D], controls [C, L, N, D]) so that the probes' read of one
layer is one contiguous block of the file, not N scattered rows: on a cluster's network file system a
strided read of [N, L, D] fetches the whole file once per layer. Writers and readers see them as [N, L, D]
views (`written`, `read_resid`), so no caller knows the layout."""

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
    """The shapes callers see: [N, L, D], controls [C, N, L, D]."""
    state = (n, n_layers, hidden)
    return dict(zip(RESID, (state, state, (control_draws, *state)), strict=True))


def _stored_axes(name: str, ndim: int) -> tuple[int, ...]:
    """The permutation from a file's seen axes to its stored ones: N and L swapped for the resid files."""
    if name not in RESID:
        return tuple(range(ndim))
    lead = ndim - 3  # the control draws' axis, if any
    return (*range(lead), lead + 1, lead, lead + 2)


def stored_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of file `name` on disk, of an array seen as `shape`."""
    return tuple(shape[axis] for axis in _stored_axes(name, len(shape)))


def _seen(name: str, stored: np.ndarray) -> np.ndarray:
    """The view of a stored array that callers index (the permutation is its own inverse)."""
    return stored.transpose(_stored_axes(name, stored.ndim))


def experiment_shapes(n: int, hidden: int, n_factors: int) -> dict[str, tuple[int, ...]]:
    return dict(zip(EXPERIMENT, ((2, n, hidden), (n, hidden), (2 * n_factors, n, hidden)), strict=True))


@contextmanager
def written(paths: Mapping[str, str], shapes: Mapping[str, tuple[int, ...]]):
    """Empty files of `shapes` at paths[name], memory-mapped for writing (in the order of shapes, as views of
    those shapes) and flushed on leaving."""
    stored = {
        name: np.lib.format.open_memmap(paths[name], mode="w+", dtype=DTYPE, shape=stored_shape(name, shape))
        for name, shape in shapes.items()
    }
    yield [_seen(name, arr) for name, arr in stored.items()]
    for arr in stored.values():
        arr.flush()


def knockout_out(clean, ko, control) -> tuple:
    """The layout `extract.knockout_states` writes into: (resid_clean, [resid_ko, control draw 0, ...])."""
    return clean, [ko, *(control[d] for d in range(len(control)))]


def _read(name: str, path, shape, samples_path) -> np.ndarray:
    """File `name` memory-mapped and seen as `shape` (None: any length on that axis), its shape checked."""
    why = f", one row per sample of {samples_path}"
    stored = validate.load_npy(path, stored_shape(name, shape), DTYPE, why=why)
    return _seen(name, stored)


def read_resid(paths: Mapping[str, str], n: int, samples_path, names=RESID) -> list[np.ndarray]:
    """The resid files `names` (resid_clean first), memory-mapped, seen as [N, L, D] ([C, N, L, D]); their
    shapes checked against the N rows of samples_path and resid_clean's L and D."""
    clean = _read("resid_clean", paths["resid_clean"], (n, None, None), samples_path)
    shapes = resid_shapes(n, clean.shape[1], clean.shape[2], None)
    others = [_read(name, paths[name], shapes[name], samples_path) for name in names if name != "resid_clean"]
    return [clean, *others]


def read_experiment(paths: Mapping[str, str], n: int, hidden: int, n_factors: int, samples_path) -> list:
    """patch, answer_only, pr, memory-mapped; shapes checked."""
    shapes = experiment_shapes(n, hidden, n_factors)
    return [_read(name, paths[name], shape, samples_path) for name, shape in shapes.items()]


def pr_pairs(pr, factors) -> dict[float, tuple[np.ndarray, np.ndarray]]:
    """factor f -> (the ×f states, the ×1/f states) of a pr array."""
    return {float(f): (pr[2 * i], pr[2 * i + 1]) for i, f in enumerate(factors)}
