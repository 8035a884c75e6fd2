"""Readers for the workflow's own intermediate files, which Snakemake takes as finished even when cut short or
left from other data: a read error, missing column, wrong shape or foreign id is one line naming the file."""

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import polars as pl

from .errors import TruthflowError

_RESULTS = re.compile(r"(?:^|/)results/")


def bad_file(path: str | Path, what: str) -> TruthflowError:
    """The one-line error for an unusable file; one under results/ gets the command that rebuilds it."""
    path = Path(path).as_posix()
    hint = f" — rebuild it with: snakemake --forcerun {path}" if _RESULTS.search(path) else ""
    return TruthflowError(f"{path}: {what}{hint}")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def check_columns(df: pl.DataFrame, path: str | Path, required: Sequence[str]) -> None:
    if missing := [c for c in required if c not in df.columns]:
        plural = "s" if len(missing) > 1 else ""
        has = ", ".join(df.columns) or "none"
        raise bad_file(path, f"missing column{plural} {', '.join(missing)} (has: {has})")


def _read(read, kind: str, path, required: Sequence[str], **kwargs) -> pl.DataFrame:
    if not isinstance(path, str | os.PathLike):  # a Snakemake input list: file by file, concatenated
        return pl.concat([_read(read, kind, p, required, **kwargs) for p in path])
    try:
        df = read(path, **kwargs)
    except Exception as exc:  # noqa: BLE001 - polars, pyarrow and OS errors alike: the file is unusable
        raise bad_file(path, f"unreadable {kind} ({_first_line(exc)})") from None
    check_columns(df, path, required)
    return df


def read_parquet(path, required_columns: Sequence[str] = (), **kwargs) -> pl.DataFrame:
    """pl.read_parquet(path, **kwargs) with the required columns (a list of paths: concatenated)."""
    return _read(pl.read_parquet, "parquet", path, required_columns, **kwargs)


def _read_tsv(path, **kwargs) -> pl.DataFrame:
    df = pl.read_csv(path, separator="\t", **kwargs)
    # polars gives the missing fields of a short row (a file cut mid-line, a ragged row) as nulls: count them
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    if not text.endswith("\n"):
        raise ValueError("truncated: the last line has no line end")
    for number, line in enumerate(text[:-1].split("\n"), start=1):
        fields = line.count("\t") + 1
        if fields != df.width and '"' not in line:  # quoted fields may hold tabs; polars checked those
            raise ValueError(f"line {number} has {fields} fields, the header {df.width}")
    return df


def read_tsv(path, required_columns: Sequence[str] = (), **kwargs) -> pl.DataFrame:
    """pl.read_csv(path, separator='\\t', **kwargs) with the required columns and whole rows."""
    return _read(_read_tsv, "TSV", path, required_columns, **kwargs)


def _fmt(shape: Iterable[int | None], dtype) -> str:
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + f"] {dtype}"


def load_npy(path, shape: Sequence[int | None] | None = None, dtype=None, *, why: str = "") -> np.ndarray:
    """np.load(path, mmap_mode='r') of `shape` (None: any length) and `dtype`; `why` explains the shape."""
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - a cut file or a broken header: ValueError, EOFError, OSError
        raise bad_file(path, f"unreadable .npy ({_first_line(exc)})") from None
    got = _fmt(arr.shape, arr.dtype)
    # numpy maps the array its header describes and ignores what follows
    if extra := Path(path).stat().st_size - arr.offset - arr.nbytes:
        raise bad_file(path, f"{extra} bytes after the end of its {got} array")
    want_shape = arr.shape if shape is None else tuple(shape)
    if len(want_shape) == arr.ndim:  # None: any length on that axis
        want_shape = tuple(g if s is None else s for s, g in zip(want_shape, arr.shape, strict=True))
    want_dtype = arr.dtype if dtype is None else np.dtype(dtype)
    if want_shape != arr.shape or want_dtype != arr.dtype:
        raise bad_file(path, f"shape {got}, expected {_fmt(want_shape, want_dtype)}{why}")
    return arr


def check_ids(df: pl.DataFrame, path, column: str, known: Iterable[str], known_path) -> None:
    """Every id in df[column] is one of `known` (those of `known_path`); a file from other data fails here."""
    known = set(known)
    if unknown := [i for i in df[column].to_list() if i not in known]:
        what = f"{len(unknown)} of its {df.height} ids are not in {Path(known_path).as_posix()}"
        raise bad_file(path, f"{what} (first: {unknown[0]!r}): it was made from other data")
