"""Glue for `script:` rules: stderr goes to the rule's log (and the terminal), a TruthflowError becomes one
clear line, and outputs are written atomically (a killed job never leaves a finished-looking file)."""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import polars as pl

from .errors import TruthflowError


class _Tee:
    def __init__(self, *streams):
        self.streams = streams

    def write(self, data):
        for s in self.streams:
            s.write(data)
            s.flush()
        return len(data)

    def flush(self):
        for s in self.streams:
            s.flush()

    def isatty(self):
        return False


def run(snakemake, main: Callable[[object], None]) -> None:
    log_path = Path(snakemake.log[0]) if snakemake.log else None
    log_fh = None
    if log_path:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_fh = log_path.open("w")
        sys.stderr = _Tee(sys.__stderr__, log_fh)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s", force=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        main(snakemake)
    except TruthflowError as exc:
        print(f"truthflow error in rule {snakemake.rule}: {exc}", file=sys.stderr)
        sys.exit(1)
    except Exception:
        traceback.print_exc(file=sys.stderr)
        raise
    finally:
        if log_fh:
            sys.stderr = sys.__stderr__
            log_fh.close()


@contextmanager
def atomic(path: str | Path):
    """Yield a temporary path next to `path`; rename onto it only when the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_parquet(df: pl.DataFrame, path: str | Path) -> None:
    with atomic(path) as tmp:
        df.write_parquet(tmp)


def write_tsv(df: pl.DataFrame, path: str | Path) -> None:
    with atomic(path) as tmp:
        df.write_csv(tmp, separator="\t")
