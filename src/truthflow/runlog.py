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
# the benchmark table's columns and where each comes from: the job's own `peaks` file, written as it ends
# (`write_peaks`), or Snakemake's `benchmark:` file. That one samples the job's process tree (every 0.5 s
# for 15 s, then every 30 s): its RSS misses a peak between two samples and its CPU time misses the work
# after the last one, so both are kept only in columns named as sampled, and no figure is read from them.
# Its wall time is exact (the job's start to its end).
PEAK_COLUMNS = ("cpu_seconds", "max_rss_mb", "max_gpu_mb")
BENCHMARK_COLUMNS = {
    "seconds": "s",
    "sampled_cpu_seconds": "cpu_time",
    "sampled_max_rss_mb": "max_rss",
}
# an analysis job's shape, what its CPU cost depends on (`truthflow.sizing.job_shape`): the benchmark table
# records it beside the job's figures, so the bill takes a finished run's figure only for the same shape
JOB_SHAPE = ("n", "layers", "hidden", "fits", "threads")
# getrusage's ru_maxrss unit: KiB on Linux, bytes on macOS
RUSAGE_BYTES = 1 if sys.platform == "darwin" else 1024


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


def raise_interrupt(signum, frame) -> None:
    """A SIGTERM handler: raised as Ctrl-C's KeyboardInterrupt is (args: the signal), in the main thread, no
    `except Exception` swallows it and every `finally` runs; Python's default ends the process in place."""
    raise KeyboardInterrupt(signum)


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
            stack.callback(signal.signal, signal.SIGTERM, signal.signal(signal.SIGTERM, raise_interrupt))
        stack.callback(_watch_snakemake().set)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        try:
            main(snakemake)
        except TruthflowError as exc:
            print(f"truthflow error in rule {snakemake.rule}: {exc}", file=sys.stderr)
            sys.exit(1)
        except KeyboardInterrupt as exc:  # SIGTERM (raise_interrupt); SIGINT (Ctrl-C reaches every job)
            signum = signal.Signals(exc.args[0] if exc.args else signal.SIGINT)
            print(f"truthflow: rule {snakemake.rule} stopped by {signum.name}", file=sys.stderr)
            sys.exit(128 + signum)
        except Exception:  # printed through the redacting stream; re-raising would print it again, unredacted
            traceback.print_exc(file=sys.stderr)
            sys.exit(1)
        if peaks := getattr(getattr(snakemake, "output", None), "peaks", None):
            write_peaks(peaks)
        if handle:  # every rule log ends with what the job made, so no log is empty
            sys.stdout.flush()
            sys.stderr.flush()
            made = ", ".join(map(str, getattr(snakemake, "output", None) or [])) or "nothing"
            handle.write(f"rule {snakemake.rule}: done in {time.perf_counter() - t0:.1f} s; wrote {made}\n")


def write_peaks(path: str) -> None:
    """The job's exact figures as it ends: CPU seconds (user and system, its own, its finished children's
    and its live children's so far), and peaks in MiB: resident memory (this process's, or a finished
    child's where larger: the kernel keeps both maxima) and torch's allocated GPU memory summed over its
    devices (NA where it loaded no CUDA; no process sampling sees GPU memory)."""
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu_seconds = sum(u.ru_utime + u.ru_stime for u in usage) + live_children_cpu()
    rss = max(u.ru_maxrss for u in usage)
    torch = sys.modules.get("torch")
    gpus = range(torch.cuda.device_count()) if torch and torch.cuda.is_initialized() else ()
    gpu = f"{sum(map(torch.cuda.max_memory_allocated, gpus)) / 2**20:.2f}" if gpus else "NA"
    values = (f"{cpu_seconds:.2f}", f"{rss * RUSAGE_BYTES / 2**20:.2f}", gpu)
    Path(path).write_text("\t".join(PEAK_COLUMNS) + "\n" + "\t".join(values) + "\n")


def live_children_cpu() -> float:
    """CPU seconds of this process's live descendants and of the children they reaped: joblib's workers
    (`pathways.probes.over_layers`) outlive the job's main() and are never waited for, so RUSAGE_CHILDREN
    misses them (tests/test_runlog.py::test_peaks_count_the_cpu_of_workers_still_alive)."""
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        with suppress(psutil.Error):
            t = child.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


def benchmark_table(benchmarks: list[str], peaks: list[str], jobs: list[dict]):
    """One row per job: its `jobs` entry (rule, model, dataset, and the JOB_SHAPE of an analysis job, NA
    for a model job), the wall seconds from its Snakemake benchmark file, the exact CPU seconds and peaks
    from its own file, then Snakemake's sampled CPU seconds and RSS (NA where Snakemake sampled nothing)."""
    import polars as pl

    from .validate import read_tsv

    def row(bench: str, peak: str, job: dict) -> pl.DataFrame:
        sampled = read_tsv(bench, list(BENCHMARK_COLUMNS.values()), infer_schema_length=0, null_values="NA")
        exact = read_tsv(peak, list(PEAK_COLUMNS), infer_schema_length=0, null_values="NA")
        return pl.concat(
            [
                sampled.select(
                    pl.col(src).cast(pl.Float64).alias(name) for name, src in BENCHMARK_COLUMNS.items()
                ),
                exact.select(pl.col(PEAK_COLUMNS).cast(pl.Float64)),
            ],
            how="horizontal",
        ).select(
            *(pl.lit(job[key]).alias(key) for key in ("rule", "model", "dataset")),
            *(pl.lit(job.get(key), pl.Int64).alias(key) for key in JOB_SHAPE),
            "seconds",
            *PEAK_COLUMNS,
            "sampled_cpu_seconds",
            "sampled_max_rss_mb",
        )

    rows = [row(*files) for files in zip(benchmarks, peaks, jobs, strict=True)]
    return pl.concat(rows) if rows else pl.DataFrame()


def _is_snakemake(proc: psutil.Process) -> bool:
    """`snakemake ...`, `python .../bin/snakemake ...` or `python -m snakemake ...`."""
    with suppress(psutil.Error):
        argv = proc.cmdline()
        return any(Path(a).name == "snakemake" for a in argv[:2]) or argv[1:3] == ["-m", "snakemake"]
    return False


def _watch_snakemake() -> threading.Event:
    """SIGTERM to this job once its snakemake is gone, even by SIGKILL (orphaned model jobs run for hours):
    Snakemake cannot, being dead. Shown by tests/test_hostile_intermediates.py::
    test_a_job_dies_with_the_snakemake_that_started_it and test_robustness.py::
    test_killing_snakemake_stops_its_jobs[SIGKILL]."""
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
    """In the main snakemake process (onstart): a SIGTERM to snakemake also stops its local script jobs, where
    Snakemake's own handler waits for them to end (hours, for a model job). Shown by
    tests/test_robustness.py::test_killing_snakemake_stops_its_jobs[SIGTERM]."""
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
