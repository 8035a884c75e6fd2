"""Glue for `script:` rules: stdout and stderr go to the rule's log and the terminal with every secret
masked (`redact`), progress bars reach the log as readable lines, a TruthflowError becomes one clear line, and
outputs are written atomically (a killed job never leaves a finished-looking file).

A job dies with the snakemake that started it (Linux: a parent-death signal, and a watch on the snakemake
process when a shell sits between them); SIGTERM and SIGINT stop it like an error (its partial files removed,
exit 143 or 130); partial files that a SIGKILL leaves behind (`.{name}.partial-{pid}`, next to the output:
the same file system, so the final rename is atomic) are removed when the job next starts.
`stop_jobs_on_sigterm` (the Snakefile's onstart) makes a SIGTERM to snakemake stop its running jobs
instead of waiting for them."""

from __future__ import annotations

import ctypes
import logging
import os
import re
import signal
import sys
import threading
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
# Tests stop a job at a known point of its work: the first time this text reaches stdout or stderr (a
# progress bar's description, say), the job sends itself SIGSTOP, and the test kills it from outside.
STOP_AT_ENV = "TRUTHFLOW_TEST_STOP_AT"
PARENT_POLL_S = 1.0


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
        self.stop_at = os.environ.get(STOP_AT_ENV) or None

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
        if self.stop_at and self.stop_at in text:
            self.stop_at = None
            self.flush()
            os.kill(os.getpid(), signal.SIGSTOP)

    def flush(self) -> None:
        if self.pending:
            self._emit(self.pending)
            self.pending = ""
        self.terminal.flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name):  # encoding, errors, fileno, … of the terminal stream
        return getattr(self.terminal, name)


class Stopped(BaseException):
    """Raised in the job's main thread by SIGTERM (from snakemake, the scheduler, or the parent-death signal):
    not an Exception, so no handler on the way swallows it, while every `finally` (atomic) still runs."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_stopped(signum, frame) -> None:
    raise Stopped(signum)


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
    saved_sigterm = _catch_sigterm()
    watch = None
    try:
        watch = die_with_parent()
        for path in getattr(snakemake, "output", None) or []:
            for stale in remove_stale_partials(path):
                print(f"removed {stale}: a partial file left by a killed run of this job", file=sys.stderr)
        t0 = time.perf_counter()
        main(snakemake)
        if log_fh:  # every rule log ends with what the job made, so no log is empty
            outputs = ", ".join(str(o) for o in (getattr(snakemake, "output", None) or [])) or "nothing"
            sys.stdout.flush()
            sys.stderr.flush()
            log_fh.write(
                f"rule {snakemake.rule}: done in {time.perf_counter() - t0:.1f} s; wrote {outputs}\n"
            )
    except TruthflowError as exc:
        print(f"truthflow error in rule {snakemake.rule}: {exc}", file=sys.stderr)
        code = 1
    except (Stopped, KeyboardInterrupt) as exc:  # SIGTERM; SIGINT (Ctrl-C reaches every job of the terminal)
        signum = exc.signum if isinstance(exc, Stopped) else signal.SIGINT
        name = signal.Signals(signum).name
        print(
            f"truthflow: rule {snakemake.rule} stopped by {name}; its partial files removed", file=sys.stderr
        )
        code = 128 + signum
    except Exception:
        # printed through the redacting stream; re-raising would print it again, unredacted
        traceback.print_exc(file=sys.stderr)
        code = 1
    else:
        code = 0
    finally:
        if saved_sigterm is not None:
            signal.signal(signal.SIGTERM, saved_sigterm)
        if watch:
            watch.set()
        _set_pdeathsig(0)
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


def _catch_sigterm():
    """SIGTERM raises Stopped in the main thread; returns the previous handler (None off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_stopped)


# ------------------------------------------------------------------------------------ dying with snakemake
PR_SET_PDEATHSIG = 1


def _set_pdeathsig(signum: int) -> bool:
    """prctl(PR_SET_PDEATHSIG, signum): the kernel sends signum when the parent (the thread that forked this
    process) exits. Linux only; False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _proc_stat(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/<pid>/stat (state, ppid, ...), None for no such process (or no /proc)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _is_snakemake(argv: list[str]) -> bool:
    """A snakemake process: `snakemake ...`, `python .../bin/snakemake ...` or `python -m snakemake ...`."""
    return any(Path(a).name == "snakemake" for a in argv[:2]) or argv[1:3] == ["-m", "snakemake"]


def start_time(pid: int) -> float | None:
    """When a live local process started (seconds since the epoch), None if there is none. Without /proc, a
    live process counts as started at -inf."""
    stat = _proc_stat(pid)
    if stat is None:
        if Path("/proc/self/stat").exists():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return float("-inf")
    if stat[0] in ("Z", "X"):  # a zombie has exited
        return None
    return _boot_time() + int(stat[19]) / os.sysconf("SC_CLK_TCK")


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def snakemake_ancestor() -> int | None:
    """The nearest ancestor process that is snakemake (the one that runs this job), or None."""
    pid = os.getppid()
    while pid > 1:
        if _is_snakemake(_argv(pid)):
            return pid
        stat = _proc_stat(pid)
        if stat is None:
            return None
        pid = int(stat[1])
    return None


def die_with_parent() -> threading.Event | None:
    """This job gets SIGTERM when snakemake dies, even by SIGKILL (an orphaned model job would keep the
    cores busy for hours). The parent-death signal covers the direct parent (the snakemake process, on a
    local run and in a SLURM job step); where a shell sits between them (`--use-conda` activation), a
    daemon thread watches the snakemake process too. Returns the event that stops that thread, if any."""
    parent = os.getppid()
    if _set_pdeathsig(signal.SIGTERM) and (os.getppid() != parent or parent == 1):
        os.kill(os.getpid(), signal.SIGTERM)  # the parent died before the signal was set
    ancestor = snakemake_ancestor()
    if ancestor is None or ancestor == parent:
        return None
    born = start_time(ancestor)
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(PARENT_POLL_S):
            if start_time(ancestor) != born:  # gone, or its pid taken by another process
                os.kill(os.getpid(), signal.SIGTERM)
                return

    threading.Thread(target=watch, name="truthflow-parent-watch", daemon=True).start()
    return stop


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _proc_stat(int(entry.name))
            if stat is not None:
                children.setdefault(int(stat[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def script_jobs(root: int | None = None) -> list[int]:
    """Processes below `root` (default: this one) that run a Snakemake `script:` job."""
    if not Path("/proc/self/stat").exists():
        return []
    return [
        pid
        for pid in _descendants(os.getpid() if root is None else root)
        if any("/.snakemake/scripts/" in a for a in _argv(pid)[1:2])
    ]


def stop_jobs_on_sigterm() -> None:
    """Call in the main snakemake process (the Snakefile's onstart): a SIGTERM to snakemake also sends SIGTERM
    to its running script jobs, which stop at once (their partial files removed); Snakemake then removes
    their outputs and exits. Snakemake's own handler only stops scheduling new jobs and waits for the running
    ones ("Will exit after finishing currently running jobs"): hours, for a model job. SLURM jobs are left to
    the executor: only local processes are signalled."""
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame) -> None:
        for pid in script_jobs():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            raise SystemExit(128 + signum)

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        pass


# --------------------------------------------------------------------------------------- atomic outputs
def partial_path(path: str | Path, pid: int | None = None) -> Path:
    """Where `atomic` writes `path` before the rename: .{name}.partial-{pid} next to it."""
    path = Path(path)
    return path.with_name(f".{path.name}.partial-{os.getpid() if pid is None else pid}")


def remove_stale_partials(path: str | Path) -> list[Path]:
    """Remove the partial files of `path` that no live process is writing: their pid is gone, or belongs to
    a process that started after the file was last written (a reused pid). Returns what was removed."""
    path = Path(path)
    prefix = f".{path.name}.partial-"
    try:
        siblings = [p for p in path.parent.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return []
    removed = []
    for sibling in siblings:
        pid = sibling.name[len(prefix) :]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            written = sibling.lstat().st_mtime
        except FileNotFoundError:
            continue
        started = start_time(int(pid))
        if started is not None and started <= written + 2:  # its writer may still be running
            continue
        try:
            sibling.unlink()
        except FileNotFoundError:
            continue
        except IsADirectoryError:
            continue
        removed.append(sibling)
    return removed


@contextmanager
def atomic(path: str | Path):
    """Yield a temporary path next to `path`; rename onto it only when the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(path)
    tmp = partial_path(path)
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
