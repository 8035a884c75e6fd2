"""Glue for `script:` rules: stdout and stderr go to the rule's log and the terminal with every secret
masked (`redact`), progress bars reach the log as readable lines, a TruthflowError becomes one clear line, and
outputs are written atomically (a killed job never leaves a finished-looking file)."""

from __future__ import annotations

import logging
import os
import re
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import polars as pl

from .errors import TruthflowError
from .redact import redact

PROGRESS_INTERVAL_S = 30.0
_BREAK = re.compile(r"(\r\n|\r|\n)")


class LogLines:
    """The log-file side of a stream: whole, redacted lines only.

    A line rewritten in place with carriage returns (a tqdm bar) reaches the file as its final state, plus at
    most one intermediate state every `interval` seconds, so a long bar leaves a few readable lines rather
    than thousands of `\r` updates.
    """

    def __init__(
        self, handle, interval: float = PROGRESS_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ):
        self.handle, self.interval, self.clock = handle, interval, clock
        self.line = ""  # text since the last \r or \n
        self.shown = ""  # the last state a \r ended
        self.rewritten = False  # this line has been rewound with \r
        self.written: str | None = None  # the state last written for this line
        self.next_at = clock() + interval

    def write(self, text: str) -> None:
        for part in _BREAK.split(text):
            if part in ("\n", "\r\n"):
                self._end()
            elif part == "\r":
                self.rewritten = True
                if self.line:
                    self.shown, self.line = self.line, ""
                    if self.clock() >= self.next_at:
                        self._put(self.shown)
                        self.written, self.next_at = self.shown, self.clock() + self.interval
            elif part:
                self.line += part

    def _end(self) -> None:
        final = self.line or self.shown
        if not (self.rewritten and final == self.written):
            self._put(final)
        self.line, self.shown, self.rewritten, self.written = "", "", False, None

    def _put(self, line: str) -> None:
        self.handle.write(redact(line.rstrip()) + "\n")
        self.handle.flush()

    def close(self) -> None:
        if self.line or self.shown:
            self._end()


class _Tee:
    """Stands in for sys.stdout / sys.stderr: redacted text to the terminal, redacted lines to the log.

    Text is passed on at line ends (\n or \r) and on flush, so a secret written in pieces is masked whole."""

    def __init__(self, terminal, log: LogLines | None = None):
        self.terminal, self.log, self.pending = terminal, log, ""

    def write(self, data: str) -> int:
        self.pending += data
        cut = max(self.pending.rfind("\n"), self.pending.rfind("\r")) + 1
        if cut:
            self._emit(self.pending[:cut])
            self.pending = self.pending[cut:]
        return len(data)

    def _emit(self, text: str) -> None:
        self.terminal.write(redact(text))
        if self.log:
            self.log.write(text)

    def flush(self) -> None:
        if self.pending:
            self._emit(self.pending)
            self.pending = ""
        self.terminal.flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name):  # encoding, errors, fileno, … of the terminal stream
        return getattr(self.terminal, name)


def run(snakemake, main: Callable[[object], None]) -> None:
    """Run `main(snakemake)` with both streams teed into the rule's log (if it has one) and redacted."""
    log_path = Path(snakemake.log[0]) if snakemake.log else None
    log_fh = None
    logs: list[LogLines] = []
    if log_path:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_fh = log_path.open("w", encoding="utf-8")
        logs = [LogLines(log_fh), LogLines(log_fh)]  # one per stream: their half-lines never mix
    saved = sys.stdout, sys.stderr
    root = logging.getLogger()
    saved_logging = root.handlers[:], root.level
    sys.stdout = _Tee(saved[0], logs[0] if logs else None)
    sys.stderr = _Tee(saved[1], logs[1] if logs else None)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    root.handlers[:] = [handler]  # not basicConfig(force=True): that would close the handlers restored below
    root.setLevel(logging.INFO)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        main(snakemake)
    except TruthflowError as exc:
        print(f"truthflow error in rule {snakemake.rule}: {exc}", file=sys.stderr)
        code = 1
    except Exception:
        # printed through the redacting stream; re-raising would print it again, unredacted
        traceback.print_exc(file=sys.stderr)
        code = 1
    else:
        code = 0
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        for lines in logs:
            lines.close()
        root.handlers[:] = saved_logging[0]
        root.setLevel(saved_logging[1])
        sys.stdout, sys.stderr = saved
        if log_fh:
            log_fh.close()
    if code:
        sys.exit(code)


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
