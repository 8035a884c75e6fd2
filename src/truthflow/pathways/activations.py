"""The activation files of one (model, dataset), the one place that knows their names, shapes, layout and
dtype: the residual stream after every layer at the probe position (resid_*.npy, from extract_pathways) and
the new states at layer K (exp_*.npy, from extract_experiments). .npy files, memory-mapped both ways (written
batch by batch, read one layer at a time), so memory stays bounded in N and L. N samples (samples.parquet's
rows, in order), L layers, D the hidden size, C control draws, F the reweighting factors.

A model's files store the dtype the model computes in (`storage`): float32 for a float32 model (the CPU
demo), float16 for a float16 one, bfloat16 for a bfloat16 one (paper configs on GPUs). Storage is then exact
for the model's own numbers and never overflows: a float32 model's residual stream may pass float16's
65,504 (Gemma-3's does), a float16 model's cannot. numpy has no bfloat16, so a bfloat16 file holds the
values' raw 16-bit patterns as uint16 (`BF16_BITS`): `written` and the readers see it as float32
(`States`), converting only the part a caller takes.

A page of a map that a process has touched stays in its resident set (RSS) until the map is closed, and a job
keeps its maps open from its first layer to its last: a reader of every layer, or a writer of every row,
would end up holding the whole files. So each part a caller takes or stores is then released from the map
(`release`), and a job holds one layer, or one batch, of a file at a time.

The resid files are stored layer-major ([L, N, D], controls [C, L, N, D]) so that the probes' read of one
layer is one contiguous block of the file, not N scattered rows: on a cluster's network file system a
strided read of [N, L, D] fetches the whole file once per layer. Writers and readers see them as [N, L, D]
views (`written`, `read_resid`), so no caller knows the layout."""

import mmap
import sys
from collections.abc import Mapping
from contextlib import contextmanager

import numpy as np

from .. import validate

# a state file's dtype by the dtype its model computes in; bfloat16's values are stored as their bit patterns
BF16_BITS = np.dtype(np.uint16)
STORAGE = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": BF16_BITS}
# resid_clean [N, L, D]; resid_ko [N, L, D], the target knockout; resid_control [C, N, L, D]
RESID = ("resid_clean", "resid_ko", "resid_control")
# patch [2, N, D]: E_Q, then the control, patched; answer_only [N, D]; pr [2F, N, D]: ×f, then ×1/f, per f
EXPERIMENT = ("patch", "answer_only", "pr")


def storage(compute) -> np.dtype:
    """The dtype of the state files of a model that computes in `compute` (a torch dtype or its name)."""
    name = str(compute).removeprefix("torch.")
    if name not in STORAGE:
        raise ValueError(f"no state storage for a model computing in {name} (one of {', '.join(STORAGE)})")
    return STORAGE[name]


def _to_bf16_bits(values) -> np.ndarray:
    """The bit patterns of the bfloat16 values nearest to `values` (ties to even, as torch converts): the top
    16 bits of their float32 patterns, rounded; NaN stays NaN."""
    x = np.asarray(values, dtype=np.float32)
    bits = np.ascontiguousarray(x).view(np.uint32)
    # below 2**32 for every finite or infinite pattern: the largest, -inf's 0xFF800000, gains at most 0x8000
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) >> 16
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded.astype(np.uint16))


def _from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """float32 values of bfloat16 bit patterns (exact: bfloat16 is float32's top half)."""
    wide = np.asarray(bits).astype(np.uint32)
    wide <<= 16
    return wide.view(np.float32)


# madvise(2)'s MADV_DONTNEED as Linux documents it for shared file mappings; elsewhere (macOS, Windows) no
# release: the pages stay resident until the map is closed
RELEASES = sys.platform == "linux" and hasattr(mmap, "MADV_DONTNEED")


def _file_map(arr) -> mmap.mmap | None:
    """The map under `arr` through its chain of bases: a np.memmap or a view of one, or the strided ndarray
    over a np.memmap that joblib rebuilds it as in a worker; None for an array in memory, or a copy-on-write
    map (np.memmap's mode 'c'), whose changes are in its pages alone."""
    base = arr
    while base is not None and not isinstance(base, mmap.mmap):
        if isinstance(base, np.memmap) and base.mode == "c":
            return None
        base = getattr(base, "base", None)
    return base


def release(arr) -> None:
    """Drop every page of the file map under `arr` from this process's resident set (madvise MADV_DONTNEED).

    np.memmap's modes 'r', 'r+' and 'w+' map the file shared, and for a shared file mapping madvise(2)
    unmaps the pages from this process alone: its RSS falls at once, and a later access reads the file's
    up-to-date contents again (from the page cache, or the disk), so no value changes, read-only or
    written. The whole map: a view's part need not be page-aligned, and pages not resident cost nothing.
    No msync first: a written page leaves the process dirty in the page cache (the kernel moves its dirty bit
    there as it unmaps it), so writeback stays asynchronous and a batch never waits on a network file
    system's write; `written` flushes the whole file once, on leaving."""
    mapping = _file_map(arr)
    if mapping is None or not RELEASES:
        return
    mapping.madvise(mmap.MADV_DONTNEED)


class States:
    """A state file's array (memory-mapped; the file's or a view of it) as callers see it: float values, a
    bfloat16 file's bit patterns (`BF16_BITS`) as float32. Indexing gives a view, as numpy's does, and reads
    nothing; np.asarray copies that part alone (a probe's one layer, never the file) in the values' dtype;
    assigning stores values in the file's dtype (bfloat16: rounded). Either then `release`s the map, so the
    pages a job has read or written do not pile up in its memory."""

    def __init__(self, stored: np.ndarray):
        self.stored = stored

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32) if self.stored.dtype == BF16_BITS else self.stored.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.stored.shape

    @property
    def ndim(self) -> int:
        return self.stored.ndim

    def __len__(self) -> int:
        return len(self.stored)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __getitem__(self, key):
        part = self.stored[key]
        if np.ndim(part) == 0:
            return _from_bf16_bits(part)[()] if self.stored.dtype == BF16_BITS else part[()]
        return States(part)

    def __setitem__(self, key, values) -> None:
        self.stored[key] = _to_bf16_bits(values) if self.stored.dtype == BF16_BITS else values
        release(self.stored)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        if self.stored.dtype == BF16_BITS:
            values = _from_bf16_bits(self.stored)
            values = values if dtype is None else values.astype(dtype, copy=False)
        else:
            values = np.array(self.stored, dtype=dtype)  # a copy: no page it reads is needed once released
        release(self.stored)
        return values

    def transpose(self, axes) -> "States":
        return States(self.stored.transpose(axes))


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


def _seen(name: str, stored: np.ndarray):
    """The view of a stored array that callers index (the permutation is its own inverse), in its values."""
    return States(stored).transpose(_stored_axes(name, stored.ndim))


def experiment_shapes(n: int, hidden: int, n_factors: int) -> dict[str, tuple[int, ...]]:
    return dict(zip(EXPERIMENT, ((2, n, hidden), (n, hidden), (2 * n_factors, n, hidden)), strict=True))


@contextmanager
def written(paths: Mapping[str, str], shapes: Mapping[str, tuple[int, ...]], compute="float32"):
    """Empty files of `shapes` at paths[name] in the storage of a model computing in `compute` (`storage`),
    memory-mapped for writing (in the order of shapes, as views of those shapes) and flushed on leaving."""
    dtype = storage(compute)
    stored = {
        name: np.lib.format.open_memmap(paths[name], mode="w+", dtype=dtype, shape=stored_shape(name, shape))
        for name, shape in shapes.items()
    }
    yield [_seen(name, arr) for name, arr in stored.items()]
    for arr in stored.values():
        arr.flush()


def knockout_out(clean, ko, control) -> tuple:
    """The layout `extract.knockout_states` writes into: (resid_clean, [resid_ko, control draw 0, ...])."""
    return clean, [ko, *(control[d] for d in range(len(control)))]


def _read(name: str, path, shape, samples_path, dtype=None):
    """File `name` memory-mapped and seen as `shape` (None: any length on that axis), its shape checked and
    its dtype one of `STORAGE`'s (or `dtype`, that of the files written beside it)."""
    why = f", one row per sample of {samples_path}"
    stored = validate.load_npy(path, stored_shape(name, shape), dtype, why=why)
    if stored.dtype not in STORAGE.values():
        kinds = ", ".join(f"{d} ({c})" for c, d in STORAGE.items())
        raise validate.bad_file(path, f"dtype {stored.dtype}, expected one of {kinds}")
    return _seen(name, stored)


def _dtype(seen: States) -> np.dtype:
    """The stored dtype of a file as `_read` gives it."""
    return seen.stored.dtype


def read_resid(paths: Mapping[str, str], n: int, samples_path, names=RESID) -> list:
    """The resid files `names` (resid_clean first), memory-mapped, seen as [N, L, D] ([C, N, L, D]) arrays of
    float values (`States`); their shapes checked against the N rows of samples_path and
    resid_clean's L and D, their dtype against resid_clean's."""
    clean = _read("resid_clean", paths["resid_clean"], (n, None, None), samples_path)
    shapes, dtype = resid_shapes(n, clean.shape[1], clean.shape[2], None), _dtype(clean)
    others = [
        _read(name, paths[name], shapes[name], samples_path, dtype) for name in names if name != "resid_clean"
    ]
    return [clean, *others]


def read_experiment(paths: Mapping[str, str], n: int, hidden: int, n_factors: int, samples_path) -> list:
    """patch, answer_only, pr, memory-mapped (as `read_resid`'s); shapes and a common dtype checked."""
    shapes = experiment_shapes(n, hidden, n_factors)
    (name, shape), *rest = shapes.items()
    first = _read(name, paths[name], shape, samples_path)
    return [first, *(_read(k, paths[k], s, samples_path, _dtype(first)) for k, s in rest)]


def pr_pairs(pr, factors) -> dict[float, tuple[np.ndarray, np.ndarray]]:
    """factor f -> (the ×f states, the ×1/f states) of a pr array."""
    return {float(f): (pr[2 * i], pr[2 * i + 1]) for i, f in enumerate(factors)}
