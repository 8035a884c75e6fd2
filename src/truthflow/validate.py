"""Readers for the workflow's own intermediate files. A file cut short by a full disk, overwritten by hand or
left from another version of the workflow still looks finished to Snakemake ("Nothing to be done"); every
stage reads its inputs through these readers, which check the schema (columns, dtypes) or the shape and size
of what they read, and fail with one line that names the file, what is wrong with it and how to rebuild it:

    results/demo/pathways/smollm2-135m/nq/resid_ko.npy: truncated: 1048576 of 3344512 bytes (expected
    [97, 30, 576] float16) — written by rule extract_pathways; rebuild it with:
    snakemake --forcerun results/demo/pathways/smollm2-135m/nq/resid_ko.npy

`--forcerun FILE` reruns exactly the job that writes the file, and then everything downstream of it.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import polars as pl

from .errors import TruthflowError

# results/<run>/<this> -> the rule that writes it (workflow/rules/*.smk; tests/test_hostile_intermediates.py
# checks this table against the rule Snakemake recorded for every file of a real run)
_PRODUCERS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(p), rule)
    for p, rule in [
        (r"data/depthqa(_nodes|\.dropped)?\.parquet", "download_depthqa"),
        (r"data/[^/]+\.parquet", "download_dataset"),
        (r"answers/[^/]+/[^/]+\.parquet", "generate_answers"),
        (r"labels/[^/]+/[^/]+\.(parquet|accuracy\.tsv)", "label_answers"),
        (r"pathways/[^/]+/[^/]+/(samples\.parquet|dropped\.parquet|resid_[a-z]+\.npy)", "extract_pathways"),
        (r"pathways/[^/]+/[^/]+/(probe_auc|deltap|summary|check)\.parquet", "probe_deltap"),
        (r"pathways/[^/]+/[^/]+/exp_((patch|answer_only|pr)\.npy|scores\.parquet)", "extract_experiments"),
        (r"pathways/[^/]+/[^/]+/exp_(rows|awareness|detection|samples)\.parquet", "pathway_experiments"),
        (
            r"tables/pathways_(experiments|awareness|detection|table3|experiment_samples)\.(parquet|tsv)",
            "experiment_tables",
        ),
        (r"depth/[^/]+/mink\.parquet", "score_mink"),
        (r"depth/[^/]+/answers\.parquet", "answer_depthqa"),
        (r"depth/[^/]+/scores\.parquet", "judge_answers"),
        (r"tables/accuracy\.tsv", "accuracy_table"),
        (r"tables/benchmarks\.tsv", "benchmark_table"),
        (r"tables/published_vs_reproduced\.tsv", "compare_published"),
        (r"tables/depth_[a-z_]+\.(parquet|tsv)", "depth_tables"),
        (
            r"tables/(pathways_summary|pathways_check|probe_auc)\.(parquet|tsv)"
            r"|tables/(exact_tokens|dropped_samples|pathways_check_layers)\.tsv",
            "pathways_tables",
        ),
    ]
]
_RESULTS = re.compile(r"(?:^|/)results/[^/]+/(.+)$")
_BENCHMARK = re.compile(r"(?:^|/)results/[^/]+/benchmarks/([^/]+)/")


def producer_rule(path: str | Path) -> str | None:
    """The rule that writes `path`, from the layout results/<run>/<stage>/...; None for any other file."""
    text = Path(path).as_posix()
    bench = _BENCHMARK.search(text)
    if bench:  # written by Snakemake's benchmark directive of that rule
        return bench.group(1)
    m = _RESULTS.search(text)
    if not m:
        return None
    return next((rule for pattern, rule in _PRODUCERS if pattern.fullmatch(m.group(1))), None)


def rebuild_hint(path: str | Path, rule: str | None = None) -> str:
    """' — written by rule R; rebuild it with: snakemake --forcerun PATH'; empty for a file no rule writes."""
    rule = rule or producer_rule(path)
    if not rule:
        return ""
    # a benchmark file is no target of its own: force its rule
    target = rule if _BENCHMARK.search(Path(path).as_posix()) else Path(path).as_posix()
    return f" — written by rule {rule}; rebuild it with: snakemake --forcerun {target}"


def bad_file(path: str | Path, what: str, rule: str | None = None) -> TruthflowError:
    """The one-line error for an unusable intermediate file."""
    return TruthflowError(f"{Path(path).as_posix()}: {what}{rebuild_hint(path, rule)}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _size(path: Path, rule: str | None) -> int:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise bad_file(path, "missing", rule) from None
    if path.is_dir():
        raise bad_file(path, "is a directory, expected a file", rule)
    if size == 0:
        raise bad_file(path, "empty file (0 bytes)", rule)
    return size


Columns = Sequence[str] | Mapping[str, "pl.DataType | type[pl.DataType] | None"]


def check_columns(df: pl.DataFrame | pl.Schema, path: str | Path, required: Columns, rule: str | None = None):
    """Every required column is there (and of the given dtype, where a Mapping gives one)."""
    schema = df.schema if isinstance(df, pl.DataFrame) else df
    wanted = required if isinstance(required, Mapping) else dict.fromkeys(required)
    missing = [c for c in wanted if c not in schema]
    if missing:
        raise bad_file(
            path,
            f"missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
            f" (has: {', '.join(schema) or 'none'})",
            rule,
        )
    for name, dtype in wanted.items():
        if dtype is not None and schema[name] != dtype:
            raise bad_file(path, f"column {name} is {schema[name]}, expected {dtype}", rule)


def read_parquet(
    path: str | Path, required_columns: Columns = (), producer_rule: str | None = None, **kwargs
) -> pl.DataFrame:
    """pl.read_parquet(path) after checking that it is a whole parquet file with the required columns.
    A list of paths (a Snakemake input list) is read file by file and concatenated."""
    if not isinstance(path, str | os.PathLike):
        return pl.concat([read_parquet(p, required_columns, producer_rule, **kwargs) for p in path])
    path = Path(path)
    size = _size(path, producer_rule)
    with path.open("rb") as fh:
        head = fh.read(4)
        fh.seek(max(0, size - 4))
        tail = fh.read(4)
    if head != b"PAR1":
        raise bad_file(path, "not a parquet file", producer_rule)
    if tail != b"PAR1":
        raise bad_file(path, f"truncated: {size} bytes and no parquet footer", producer_rule)
    try:
        df = pl.read_parquet(path, **kwargs)
    except Exception as exc:  # noqa: BLE001 - polars, pyarrow and OS errors alike: the file is unusable
        raise bad_file(path, f"unreadable parquet ({_first_line(exc)})", producer_rule) from None
    check_columns(df, path, required_columns, producer_rule)
    return df


def count_rows(path: str | Path, required_columns: Columns = (), producer_rule: str | None = None) -> int:
    """Rows of a parquet file, read whole once (so a file that cannot be read fails here, not later)."""
    return read_parquet(path, required_columns, producer_rule).height


def read_tsv(
    path: str | Path, required_columns: Columns = (), producer_rule: str | None = None, **kwargs
) -> pl.DataFrame:
    """pl.read_csv(path, separator='\\t') after checking that the file ends with a whole line; every row has
    the header's number of fields and the required columns are there. A list of paths is concatenated."""
    if not isinstance(path, str | os.PathLike):
        return pl.concat([read_tsv(p, required_columns, producer_rule, **kwargs) for p in path])
    path = Path(path)
    size = _size(path, producer_rule)
    with path.open("rb") as fh:
        fh.seek(size - 1)
        if fh.read(1) != b"\n":
            raise bad_file(path, "truncated: the last line has no line end", producer_rule)
    try:
        df = pl.read_csv(path, separator="\t", **kwargs)
    except Exception as exc:  # noqa: BLE001
        raise bad_file(path, f"unreadable TSV ({_first_line(exc)})", producer_rule) from None
    header = len(df.columns)
    with path.open(encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, start=1):
            fields = line.rstrip("\r\n").count("\t") + 1
            if fields != header and '"' not in line:  # quoted fields may hold tabs; polars checked those
                raise bad_file(path, f"line {number} has {fields} fields, the header {header}", producer_rule)
    check_columns(df, path, required_columns, producer_rule)
    return df


Shape = Sequence[int | None]


def _fmt_shape(shape: Iterable[int | None]) -> str:
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"


def npy_header(path: str | Path, producer_rule: str | None = None) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, data offset) from the header of a .npy file; the data itself is not read."""
    path = Path(path)
    _size(path, producer_rule)
    try:
        with path.open("rb") as fh:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            else:
                raise ValueError(f"unsupported .npy version {version}")
            offset = fh.tell()
    except Exception as exc:  # noqa: BLE001 - a broken header: ValueError, EOFError, SyntaxError...
        raise bad_file(path, f"not a .npy array ({_first_line(exc)})", producer_rule) from None
    if fortran or dtype.hasobject:
        raise bad_file(path, "not a plain C-ordered numeric array", producer_rule)
    return tuple(shape), dtype, offset


def load_npy(
    path: str | Path,
    shape: Shape | None = None,
    dtype: str | np.dtype | type | None = None,
    producer_rule: str | None = None,
    *,
    ndim: int | None = None,
    mmap: bool = True,
    why: str = "",
) -> np.ndarray:
    """np.load(path, mmap_mode='r') after checking the header against the expected shape (None: any length
    on that axis), number of dimensions and dtype, and the file size against the header (a truncated array
    would otherwise fail deep inside the next stage, or not at all with mmap).

    why: what the expected shape follows from, added to a shape mismatch (", one row per sample of ...")."""
    path = Path(path)
    got_shape, got_dtype, offset = npy_header(path, producer_rule)
    want = np.dtype(dtype) if dtype is not None else got_dtype
    if shape is not None:
        expected = [g if s is None else s for s, g in zip(shape, got_shape, strict=False)]
        if len(shape) != len(got_shape):
            expected = list(shape)
    else:
        expected = list(got_shape)
    expected_text = f"{_fmt_shape(expected)} {want}"
    size = path.stat().st_size
    need = offset + math.prod(got_shape) * got_dtype.itemsize
    if size < need:
        raise bad_file(path, f"truncated: {size} of {need} bytes (expected {expected_text})", producer_rule)
    if size > need:
        raise bad_file(
            path,
            f"{size - need} bytes after the end of its {_fmt_shape(got_shape)} {got_dtype} array",
            producer_rule,
        )
    if ndim is not None and len(got_shape) != ndim:
        raise bad_file(
            path, f"has {len(got_shape)} dimensions {_fmt_shape(got_shape)}, expected {ndim}", producer_rule
        )
    if shape is not None and list(got_shape) != expected:
        raise bad_file(
            path, f"shape {_fmt_shape(got_shape)} {got_dtype}, expected {expected_text}{why}", producer_rule
        )
    if dtype is not None and got_dtype != want:
        raise bad_file(path, f"dtype {got_dtype}, expected {want}", producer_rule)
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001
        raise bad_file(path, f"unreadable .npy ({_first_line(exc)})", producer_rule) from None


def check_ids(
    df: pl.DataFrame,
    path: str | Path,
    column: str,
    known: Iterable[str],
    known_path: str | Path,
    producer_rule: str | None = None,
) -> None:
    """Every id in df[column] (read from `path`) is one of `known` (the ids of `known_path`): a file left
    from another dataset, n or seed fails here rather than as a KeyError or an empty join later."""
    known = set(known)
    unknown = [i for i in df[column].to_list() if i not in known]
    if unknown:
        raise bad_file(
            path,
            f"{len(unknown)} of its {df.height} ids are not in {Path(known_path).as_posix()}"
            f" (first: {unknown[0]!r}): it was made from other data",
            producer_rule,
        )
