"""Glue for `script:` rules (Snakemake hands them only the log's path): `run` tees stdout, stderr and logging
into it, secrets masked, progress bars thinned; an error, SIGTERM or SIGINT ends the job in one line."""

import logging
import os
import re
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack, redirect_stderr, redirect_stdout, suppress
from pathlib import Path

import psutil

from .errors import TruthflowError
from .redact import redact

PROGRESS_INTERVAL_S = 30.0
_BREAK = re.compile(r"(\r\n|\r|\n)")
# Tests stop a job at a known point: the first time this text reaches stdout or stderr, it SIGSTOPs itself.
STOP_AT_ENV = "TRUTHFLOW_TEST_STOP_AT"
PARENT_POLL_S = 1.0
BENCHMARK_COLUMNS = ["seconds", "cpu_seconds", "max_rss_mb", "max_gpu_mb"]  # a model job's benchmark file


class _Tee:
    """Stands in for sys.stdout / sys.stderr: redacted text to the terminal at line ends and on flush (a
    secret in pieces is masked whole), whole lines to the log (a \r-redrawn one once per `interval` s)."""

    def __init__(self, terminal, handle=None, interval: float = PROGRESS_INTERVAL_S, clock=time.monotonic):
        self.terminal, self.handle, self.interval, self.clock = terminal, handle, interval, clock
        self.pending, self.stop_at = "", os.environ.get(STOP_AT_ENV) or None
        self.line, self.written, self.redraw = "", None, False  # the line's state; the state last written
        self.next_at = clock() + interval

    def write(self, data: str) -> int:
        self.pending += data
        cut = max(self.pending.rfind("\n"), self.pending.rfind("\r")) + 1
        if cut:
            self._emit(self.pending[:cut])
            self.pending = self.pending[cut:]
        return len(data)

    def _emit(self, text: str) -> None:
        self.terminal.write(redact(text))
        for part in _BREAK.split(text) if self.handle else ():
            if part in ("\n", "\r\n"):
                self._put()
                self.line, self.written, self.redraw = "", None, False
            elif part == "\r":
                self.redraw = True
                if self.line and self.clock() >= self.next_at:
                    self._put()
                    self.written, self.next_at = self.line, self.clock() + self.interval
            elif part:
                self.line, self.redraw = (part if self.redraw else self.line + part), False
        if self.stop_at and self.stop_at in text:
            self.stop_at = None
            self.flush()
            os.kill(os.getpid(), signal.SIGSTOP)

    def _put(self) -> None:
        if self.line != self.written:
            self.handle.write(redact(self.line.rstrip()) + "\n")
            self.handle.flush()

    def flush(self) -> None:
        if self.pending:
            self._emit(self.pending)
            self.pending = ""
        self.terminal.flush()

    def close(self) -> None:
        self.flush()
        if self.line:
            self._put()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name):  # encoding, errors, fileno, … of the terminal stream
        return getattr(self.terminal, name)


def _stop(signum, frame) -> None:
    raise KeyboardInterrupt(signum)  # in the main thread: no `except Exception` swallows it, `finally`s run


def run(snakemake, main: Callable[[object], None]) -> None:
    """`main(snakemake)` with streams and logging teed into the rule's log; a failure: one line, exit code."""
    t0 = time.perf_counter()
    with ExitStack() as stack:
        handle = None
        if snakemake.log:
            Path(snakemake.log[0]).parent.mkdir(parents=True, exist_ok=True)
            handle = stack.enter_context(open(snakemake.log[0], "w", encoding="utf-8"))
        out, err = _Tee(sys.stdout, handle), _Tee(sys.stderr, handle)  # each keeps its own half-line
        stack.enter_context(redirect_stdout(out))
        stack.enter_context(redirect_stderr(err))
        stack.callback(err.close)
        stack.callback(out.close)
        handler, root = logging.StreamHandler(err), logging.getLogger()
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        stack.callback(setattr, root, "handlers", root.handlers)
        root.handlers = [handler]  # only ours: a handler on the real stderr would bypass `redact`
        root.setLevel(logging.INFO)
        if threading.current_thread() is threading.main_thread():
            stack.callback(signal.signal, signal.SIGTERM, signal.signal(signal.SIGTERM, _stop))
        stack.callback(_watch_snakemake().set)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        try:
            main(snakemake)
        except TruthflowError as exc:
            print(f"truthflow error in rule {snakemake.rule}: {exc}", file=sys.stderr)
            sys.exit(1)
        except KeyboardInterrupt as exc:  # SIGTERM (_stop); SIGINT (Ctrl-C reaches every job of the terminal)
            signum = signal.Signals(exc.args[0] if exc.args else signal.SIGINT)
            print(f"truthflow: rule {snakemake.rule} stopped by {signum.name}", file=sys.stderr)
            sys.exit(128 + signum)
        except Exception:  # printed through the redacting stream; re-raising would print it again, unredacted
            traceback.print_exc(file=sys.stderr)
            sys.exit(1)
        if bench := getattr(getattr(snakemake, "output", None), "benchmark", None):
            _write_benchmark(bench)
        if handle:  # every rule log ends with what the job made, so no log is empty
            sys.stdout.flush()
            sys.stderr.flush()
            made = ", ".join(map(str, getattr(snakemake, "output", None) or [])) or "nothing"
            handle.write(f"rule {snakemake.rule}: done in {time.perf_counter() - t0:.1f} s; wrote {made}\n")


def _write_benchmark(path: str) -> None:
    """A job's benchmark, from the kernel as it ends (not sampled): wall s, CPU s, peak RSS MB, GPU MB."""
    usage, torch = resource.getrusage(resource.RUSAGE_SELF), sys.modules.get("torch")
    gpus = range(torch.cuda.device_count()) if torch and torch.cuda.is_initialized() else ()
    gpu = sum(map(torch.cuda.max_memory_allocated, gpus)) / 2**20 if gpus else None
    cpu, wall = usage.ru_utime + usage.ru_stime, time.time() - psutil.Process().create_time()
    cells = [f"{v:.2f}" if v is not None else "NA" for v in (wall, cpu, usage.ru_maxrss / 1024, gpu)]
    Path(path).write_text("\t".join(BENCHMARK_COLUMNS) + "\n" + "\t".join(cells) + "\n")


def _is_snakemake(proc: psutil.Process) -> bool:
    """`snakemake ...`, `python .../bin/snakemake ...` or `python -m snakemake ...`."""
    with suppress(psutil.Error):
        argv = proc.cmdline()
        return any(Path(a).name == "snakemake" for a in argv[:2]) or argv[1:3] == ["-m", "snakemake"]
    return False


def _watch_snakemake() -> threading.Event:
    """SIGTERM to this job once its snakemake is gone, even by SIGKILL (orphaned model jobs run for hours)."""
    stop, chain = threading.Event(), [psutil.Process(), *psutil.Process().parents()]
    top = next((i for i in range(1, len(chain)) if _is_snakemake(chain[i])), None)
    if top is None:
        return stop

    def watch(below: psutil.Process, snakemake_pid: int) -> None:
        while not stop.wait(PARENT_POLL_S):
            with suppress(psutil.Error):
                if below.ppid() == snakemake_pid:
                    continue
            os.kill(os.getpid(), signal.SIGTERM)
            return

    threading.Thread(target=watch, args=(chain[top - 1], chain[top].pid), daemon=True).start()
    return stop


def stop_jobs_on_sigterm() -> None:
    """In the main snakemake process (onstart): a SIGTERM to snakemake also stops its local script jobs."""
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame) -> None:
        for proc in psutil.Process().children(recursive=True):
            with suppress(psutil.Error):
                if any("/.snakemake/scripts/" in a for a in proc.cmdline()[1:2]):
                    proc.terminate()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
