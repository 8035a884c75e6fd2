"""The warm process (truthflow.warm): a job's script handed to it runs in a forked process with the script's
streams, directory, environment and exit code; signals reach it; it ends with its launcher or snakemake."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from truthflow import models, warm

SRC = Path(__file__).resolve().parents[1] / "src"
# a job's script as Snakemake runs it: `snakemake` first, then the hand-over, then the job
SCRIPT = """
import os, signal, sys, time
from types import SimpleNamespace
snakemake = SimpleNamespace(input=SimpleNamespace(), params=SimpleNamespace(), rule="toy")
from truthflow import warm
warm.delegate(snakemake)
def stopped(signum, frame):
    print(f"stopped by {signum}", flush=True)
    open("stopped", "w").close()
    sys.exit(7)
signal.signal(signal.SIGTERM, stopped)
print(f"job {os.getpid()} ppid {os.getppid()} in {os.getcwd()} with {os.environ.get('TOY')}", flush=True)
if sys.argv[1] == "wait":
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A warm process for this module (its parent: pytest), and a toy job script."""
    folder = tmp_path_factory.mktemp("warm")
    sock, script = folder / "socket", folder / "job.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen([sys.executable, "-m", "truthflow.warm", str(sock), str(os.getpid())], env=env)
    deadline = time.time() + 60
    while not sock.exists() and time.time() < deadline:
        time.sleep(0.05)
    yield proc, sock, script
    proc.terminate()
    proc.wait(timeout=30)


def _launch(sock, script, arg, cwd, **kw):
    env = {**os.environ, "PYTHONPATH": str(SRC), "TOY": "here", warm.SOCKET_ENV: str(sock)}
    return subprocess.Popen(
        [sys.executable, str(script), arg], cwd=cwd, env=env, stdout=subprocess.PIPE, text=True, **kw
    )


def test_a_job_runs_forked_with_its_streams_directory_environment_and_exit_code(server, tmp_path):
    proc, sock, script = server
    launcher = _launch(sock, script, "3", tmp_path)
    out, _ = launcher.communicate(timeout=120)
    assert launcher.returncode == 3
    pid, ppid = (int(w) for w in out.split()[1:4:2])
    assert pid != launcher.pid and ppid == proc.pid  # forked from the warm process, not run in the launcher
    assert f"in {tmp_path} with here" in out


def test_without_a_warm_process_the_job_runs_in_its_own_process(tmp_path):
    launcher = _launch(tmp_path / "no-socket", tmp_path / "job.py", "0", tmp_path)
    (tmp_path / "job.py").write_text(SCRIPT)
    out, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 0 and out.startswith(f"job {launcher.pid} ")


def test_a_signal_to_the_launcher_reaches_the_job(server, tmp_path):
    _, sock, script = server
    launcher = _launch(sock, script, "wait", tmp_path)
    assert launcher.stdout.readline().startswith("job ")
    launcher.send_signal(signal.SIGTERM)
    out, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 7 and "stopped by 15" in out


def test_a_killed_launcher_stops_its_job(server, tmp_path):
    _, sock, script = server
    launcher = _launch(sock, script, "wait", tmp_path)
    line = launcher.stdout.readline()
    launcher.kill()  # the job sees its connection close
    launcher.wait(timeout=30)
    deadline = time.time() + 30
    while not (tmp_path / "stopped").exists() and time.time() < deadline:
        time.sleep(0.1)
    assert (tmp_path / "stopped").exists(), line


def test_a_killed_job_fails_its_launcher(server, tmp_path):
    _, sock, script = server
    launcher = _launch(sock, script, "wait", tmp_path, stderr=subprocess.PIPE)
    job = int(launcher.stdout.readline().split()[1])
    os.kill(job, signal.SIGKILL)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode != 0 and "the process of the toy job was killed" in err


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_warm_process_ends_with_its_parent(tmp_path):
    """snakemake killed: its warm process does not outlive it."""
    sock = tmp_path / "socket"
    start = "import os, subprocess as s, sys, time\ns.Popen([*sys.argv[1:], str(os.getpid())])\ntime.sleep(9)"
    parent = subprocess.Popen(
        [sys.executable, "-c", start, sys.executable, "-m", "truthflow.warm", str(sock)],
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    deadline = time.time() + 60
    while not sock.exists() and time.time() < deadline:
        time.sleep(0.05)
    server = int(subprocess.run(["pgrep", "-P", str(parent.pid)], capture_output=True, text=True).stdout)
    parent.kill()
    parent.wait()
    deadline = time.time() + 30
    while _alive(server) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(server)


@pytest.mark.model
def test_a_warm_model_is_the_one_a_job_loads(smollm_dir):
    models.warm_model(smollm_dir, "float32")
    try:
        model, tokenizer, device = models.load_pretrained(smollm_dir, "float32")
        assert (model, tokenizer, device) == models._WARM[(os.path.realpath(smollm_dir), "float32")]
        assert models.load_pretrained(smollm_dir, "bfloat16")[0] is not model  # another dtype loads anew
    finally:
        models._WARM.clear()
