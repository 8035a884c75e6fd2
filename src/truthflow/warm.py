"""A warm process for a local run's model jobs on a CPU: torch, transformers and each model loaded once, every
job forked from it, so a job skips 5-10 s of imports and loading yet stays its own process (its log, signals,
benchmark and failure). Snakemake starts a model job's script as ever; `delegate` hands it to the warm process
where one listens (SOCKET_ENV, set by `start`) and exits with the forked job's exit code."""

from __future__ import annotations

import os
import pickle
import runpy
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

SOCKET_ENV = "TRUTHFLOW_WARM_SOCKET"
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def start(min_jobs: int, model_jobs: int) -> subprocess.Popen | None:
    """In snakemake (onstart of a local CPU run): the warm process, when `model_jobs` reach `min_jobs`."""
    if model_jobs < min_jobs:
        return None
    path = Path(tempfile.mkdtemp(prefix="truthflow-warm-"), "socket")
    server = subprocess.Popen([sys.executable, "-m", "truthflow.warm", str(path), str(os.getpid())])
    os.environ[SOCKET_ENV] = str(path)
    return server


def stop(server: subprocess.Popen | None) -> None:
    if server is not None and server.poll() is None:
        server.terminate()


def delegate(sm) -> None:
    """In a job's script, before its heavy imports: run it in the warm process if one listens, then exit."""
    path = os.environ.get(SOCKET_ENV)
    if not path:
        return
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        return  # none listens (stopped, or started by another run): the job runs here
    model = getattr(sm.input, "model", None)  # warm only on a machine without a GPU (the Snakefile)
    request = pickle.dumps(
        {
            "argv": sys.argv,
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "model": model,
            "dtype": getattr(sm.params, "dtype", "auto"),
        }  # fmt: skip
    )
    socket.send_fds(conn, [struct.pack("!I", len(request)) + request], [0, 1, 2])
    for signum in _SIGNALS:  # forwarded to the job, which ends as it would on its own
        signal.signal(signum, lambda s, _: conn.send(bytes([s])))
    code = b""
    while not code:
        try:
            code = conn.recv(1) or b"\xff"
        except InterruptedError:
            continue
    if code == b"\xff":
        print(f"truthflow: the {sm.rule} job's process was killed", file=sys.stderr)
        sys.exit(1)
    sys.exit(code[0])


def serve(path: str, parent: int) -> None:
    """Import what model jobs import, then fork a job per connection until snakemake (`parent`) is gone."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)  # first: a job that starts meanwhile waits in the backlog
    listener.listen(64)
    import torch

    torch.set_num_threads(1)  # no thread pool before a fork: each job sets its own threads

    import snakemake.script  # noqa: F401 - each job's script preamble
    from transformers.utils import logging as hf_logging

    from . import jobs, models, runlog, validate  # noqa: F401
    from .depth import mink, prompts  # noqa: F401
    from .pathways import activations, experiments, extract  # noqa: F401

    hf_logging.disable_progress_bar()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the jobs
    listener.settimeout(1.0)
    while os.getppid() == parent:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        conn.settimeout(None)
        request, fds = _receive(conn)
        if request.get("model"):
            try:
                models.warm_model(request["model"], request["dtype"])
            except Exception:  # noqa: BLE001 - the job loads the model itself and reports what fails
                pass
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            listener.close()
            _run_job(conn, request, fds)
        conn.close()
        for fd in fds:
            os.close(fd)
    Path(path).unlink(missing_ok=True)


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    size = struct.unpack("!I", data[:4])[0]
    while len(data) < 4 + size:
        data += conn.recv(4 + size - len(data))
    return pickle.loads(data[4:]), fds


def _run_job(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked job: the launcher's streams, directory and environment, then its script; no return."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        for signum in (signal.SIGCHLD, *_SIGNALS):
            signal.signal(signum, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        del os.environ[SOCKET_ENV]  # the script runs here, not delegated again
        sys.argv = list(request["argv"])
        threading.Thread(target=_watch_launcher, args=(conn,), daemon=True).start()
        runpy.run_path(sys.argv[0], run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (exc.code is not None)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the job's own failure, reported as a script's would be
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110
                pass
        try:
            conn.sendall(bytes([min(int(code), 254)]))
        finally:
            os._exit(int(code))


def _watch_launcher(conn: socket.socket) -> None:
    """A signal the launcher forwards is raised here; the launcher gone (killed) ends the job by SIGTERM."""
    while data := conn.recv(1):
        os.kill(os.getpid(), data[0])
    os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
