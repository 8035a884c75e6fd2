"""A job's memory holds the part of a state file it is reading or writing, not the whole file: a page of a
memory map that a process has touched counts in its resident set (RSS) until it is released, and sites that
enforce RSS kill a job whose maps have grown to its files. Each case runs in a fresh process, so that
getrusage's peak (ru_maxrss) is that of the reading or writing alone, measured from the process's own peak
once its imports are done. And the analysis jobs' memory requests cover the peaks measured."""

import json
import subprocess
import sys

import pytest

from truthflow import sizing
from truthflow.config import schema_defaults
from truthflow.memplan import Dims
from truthflow.pathways import activations

N, LAYERS, BATCH = 2_000, 10, 40
# (the dtype the model computes in, D): 328 MB files either way
SHAPES = [("float32", 4_096), ("bfloat16", 8_192)]

WRITE = """
import json, resource, sys
import numpy as np
from truthflow.pathways import activations
path, compute, n, layers, hidden, batch = json.loads(sys.argv[1])
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
shapes = {"resid_clean": (n, layers, hidden)}
with activations.written({"resid_clean": path}, shapes, compute) as (clean,):
    base = peak()
    rows = np.random.default_rng(0).permutation(n)  # the engine's batches: rows in length order, scattered
    for start in range(0, n, batch):
        idx = np.sort(rows[start : start + batch])
        values = (idx % 16)[:, None, None] + 16 * np.arange(layers)[None, :, None]  # exact in bfloat16
        clean[idx] = np.broadcast_to(values, (len(idx), layers, hidden)).astype(np.float32)
print(json.dumps({"base": base, "peak": peak()}))
"""

READ = """
import json, resource, sys
import numpy as np
from truthflow.pathways import activations
path, compute, n, layers, hidden, batch = json.loads(sys.argv[1])
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
(clean,) = activations.read_resid({"resid_clean": path}, n, "samples.parquet", names=["resid_clean"])
base, wrong = peak(), []
for layer in range(layers):  # as the probes read: one layer at a time, copied in float32
    x = np.asarray(clean[:, layer], dtype=np.float32)
    if not (x == ((np.arange(n) % 16) + 16 * layer)[:, None]).all():
        wrong.append(layer)
    del x
print(json.dumps({"base": base, "peak": peak(), "wrong": wrong}))
"""


def _run(script: str, *args) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(args)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(sys.platform != "linux", reason="mapped pages are released on Linux only")
@pytest.mark.parametrize(("compute", "hidden"), SHAPES)
def test_a_state_file_written_and_read_never_holds_half_its_size(tmp_path, compute, hidden):
    """A 328 MB file written in the engine's scattered batches, then read layer by layer as the probes
    read it: each process grows by a batch or a layer (its float32 copy, the conversion's temporaries and
    the window of the map), far less than half the file; a process that kept the pages it touched grew by
    the whole file."""
    path = str(tmp_path / "resid_clean.npy")
    args = (path, compute, N, LAYERS, hidden, BATCH)
    size = N * LAYERS * hidden * activations.storage(compute).itemsize
    written = _run(WRITE, *args)
    read = _run(READ, *args)
    assert read["wrong"] == []  # every value written, released and read back
    for what, got in (("writing", written), ("reading", read)):
        grew = got["peak"] - got["base"]
        assert grew < size / 2, (
            f"{what} grew the process by {grew / 2**20:,.0f} MiB, for a file of {size:,} bytes"
        )


def test_requests_cover_the_newest_peak_measured_at_each_shape():
    """probe_deltap's and pathway_experiments' mem_mb is no lower than the newest peak benchmarks/cpu_cost.tsv
    holds for the rule at each shape and thread count (bench_cpu_stages: the job's process tree, its
    workers and mapped pages included), with the benchmark's settings: the default control draws and
    reweighting factors."""
    rows = sizing.read_rows(
        sizing.CPU_COST, ["rule", "n", "layers", "hidden", "fits", "threads", "peak_rss_mb"]
    )
    newest = {}
    for row in rows:  # appended in the order measured
        if row["rule"] in ("probe_deltap", "pathway_experiments"):
            newest[(row["rule"], *(int(row[k]) for k in ("n", "layers", "hidden", "fits", "threads")))] = row
    draws = schema_defaults("pathways", "knockout")["control_draws"]
    factors = len(schema_defaults("pathways", "experiments")["pr_factors"])
    short = []
    for (rule, n, layers, hidden, _, threads), row in newest.items():
        dims = Dims(layers=layers, hidden=hidden, heads=1, kv_heads=1, head_dim=1, intermediate=1, vocab=1)
        seconds = threads * sizing.SECONDS_PER_THREAD  # the CPU time of a job that asks for `threads`
        if rule == "probe_deltap":
            request = sizing.probe_request(n, dims, draws, seconds)
        else:
            request = sizing.experiments_request(n, dims, factors, seconds)
        if request.threads != threads:
            continue  # more threads than the job would ask for at its layer count
        if request.mem_mb < int(row["peak_rss_mb"]):
            short.append(
                f"{rule} N {n}, {layers} layers, D {hidden}, {threads} threads: {request.mem_mb} MiB "
                f"asked, {row['peak_rss_mb']} measured ({row['date']})"
            )
    assert newest
    assert not short, "\n".join(short)
