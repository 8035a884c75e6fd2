"""A warm process for a local run on a CPU: torch, transformers and each model imported and loaded once, every
job forked from it, so a model job skips 5-10 s of imports and loading yet stays its own process (its log,
signals, benchmark, failure). Snakemake starts a job's script as ever; its first line, `delegate`, hands it to
the warm process where one listens (SOCKET_ENV, set by `start`) and exits with the job's code. Scripts import
this module by name, so it is no job's code input: editing it reruns nothing."""

import gc
import os
import pickle
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from contextlib import suppress
from pathlib import Path

SOCKET_ENV = "TRUTHFLOW_WARM_SOCKET"
_KILLED = 255  # the job's process ended without its exit code (SIGKILL, the OOM killer)


def start() -> subprocess.Popen:
    """In snakemake (onstart): the warm process, its socket named in SOCKET_ENV for the jobs."""
    path = Path(tempfile.mkdtemp(prefix="truthflow-warm-"), "socket")
    server = subprocess.Popen([sys.executable, "-m", "truthflow.warm", str(path), str(os.getpid())])
    os.environ[SOCKET_ENV] = str(path)
    return server


def stop(server: subprocess.Popen) -> None:
    server.terminate()
    shutil.rmtree(Path(server.args[3]).parent, ignore_errors=True)


def delegate(sm) -> None:
    """Run this job's script (sys.argv) in the warm process if one listens, and exit with its code."""
    model, dtype = getattr(sm.input, "model", None), getattr(sm.params, "dtype", None)
    model = model and os.path.abspath(model)
    request = {"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ), "model": model, "dtype": dtype}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # whole messages, an end on either side
    try:
        conn.connect(os.environ[SOCKET_ENV])
        socket.send_fds(conn, [pickle.dumps(request)], [0, 1, 2])
    except (KeyError, OSError):
        return  # none listens (a cluster, GPU or conda run, or it has ended): the job runs in this process

    def forward(signum, frame):  # SIGTERM (snakemake stopping, a scheduler): the job ends as it would alone
        with suppress(OSError):
            conn.send(bytes([signum]))

    signal.signal(signal.SIGTERM, forward)  # Ctrl-C's SIGINT reaches the job itself: its process group
    code = (conn.recv(1) or bytes([_KILLED]))[0]
    if code == _KILLED:
        print(f"truthflow: the process of the {sm.rule} job was killed", file=sys.stderr)
    sys.exit(code)


def serve(path: str, parent: int) -> None:
    """Import what jobs import, then fork a job per connection until snakemake (`parent`) is gone."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)  # first: a job that starts meanwhile waits in the backlog
    listener.listen(64)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):  # read as the libraries load: one-thread jobs
        os.environ[var] = "1"  # stay one thread (not one per CPU each); model jobs set torch's threads
    import torch

    torch.set_num_threads(1)  # no thread pool before a fork: each job sets its own threads
    import snakemake.script  # noqa: F401 - the script's preamble
    from transformers.utils import logging as hf_logging

    from . import jobs, models, plotting  # noqa: F401
    from .depth import mink, plots, tables  # noqa: F401
    from .pathways import check, experiments, extract, plots_experiments, probes  # noqa: F401
    from .pathways import plots as _  # noqa: F401

    hf_logging.disable_progress_bar()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the jobs
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the jobs and snakemake, which stops this
    listener.settimeout(1.0)
    while os.getppid() == parent:
        with suppress(TimeoutError):
            conn = listener.accept()[0]
            data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            request = pickle.loads(data)
            if request["model"]:
                with suppress(Exception):  # the job loads it itself, and reports what fails
                    models.warm_model(request["model"], request["dtype"])
            sys.stderr.flush()
            gc.freeze()  # a job's collections skip (and so never copy) the objects it inherits
            if os.fork() == 0:
                listener.close()
                _run_job(conn, request, fds)
            conn.close()
            for fd in fds:
                os.close(fd)
    with suppress(OSError):
        os.unlink(path)
        os.rmdir(Path(path).parent)


def _run_job(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked job: the launcher's streams, directory, environment and script; never returns."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({k: v for k, v in request["env"].items() if k != SOCKET_ENV})  # never handed on
        sys.argv = request["argv"]
        threading.Thread(target=_watch_launcher, args=(conn,), daemon=True).start()
        runpy.run_path(sys.argv[0], run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the job's own failure, printed as a script's would be
        traceback.print_exc()
    finally:
        with suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
            conn.send(bytes([min(code, _KILLED - 1)]))
        os._exit(code)


def _watch_launcher(conn: socket.socket) -> None:
    """A signal the launcher forwards is raised here; the launcher gone (killed) stops the job by SIGTERM."""
    while data := conn.recv(1):
        os.kill(os.getpid(), data[0])
    os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
