"""What an analysis job asks of its scheduler: threads and memory for probe_deltap and pathway_experiments,
from the shapes of the states they read (N rows, L layers, D hidden units), so a SLURM job gets the right
request and a local run shares its cores sensibly.

Both jobs fit per-layer probes, side by side in `threads` worker processes (`pathways.probes.over_layers`).
A worker holds one layer of each state array it reads in float32 and a training fold's scaled copy of the
clean layer; the job's own process holds the per-sample tables (N x L rows)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from . import validate
from .memplan import Dims
from .pathways.probes import n_folds

# a job long enough to want workers: its one-thread CPU time over this many seconds asks for one more
SECONDS_PER_THREAD = 600
# the most workers a job asks for: more share one machine's memory bandwidth, which the fits are bound by
MAX_THREADS = 8
FLOAT32 = 4
MIB = 2**20
# the job's own process: Python, numpy, polars and scikit-learn, before any state is read
BASE_MB = 1_000
# probe_deltap's per-sample table: N x L rows for the target and for the controls, ids as strings
TABLE_BYTES_PER_ROW = 200


@dataclass(frozen=True)
class Request:
    threads: int
    mem_mb: int


def threads_for(cpu_seconds: float, layers: int) -> int:
    """Workers for a job of `cpu_seconds` on one thread: one per SECONDS_PER_THREAD, at most one per layer
    and MAX_THREADS."""
    wanted = math.ceil(cpu_seconds / SECONDS_PER_THREAD)
    return max(1, min(wanted, layers, MAX_THREADS))


def worker_bytes(n: int, hidden: int, arrays: int) -> int:
    """One worker's peak: one layer of each of `arrays` state arrays in float32, plus the scaled copy of a
    training fold of the clean layer and the fit's workspace (together about two more layers)."""
    layer = n * hidden * FLOAT32
    return (arrays + 2) * layer


def probe_request(n: int, dims: Dims, control_draws: int, cpu_seconds: float) -> Request:
    """probe_deltap: the clean layer, the target knockout's and each control draw's."""
    threads = threads_for(cpu_seconds, dims.layers)
    arrays = 2 + control_draws
    tables = 2 * n * dims.layers * TABLE_BYTES_PER_ROW
    total = BASE_MB * MIB + threads * worker_bytes(n, dims.hidden, arrays) + tables
    return Request(threads, math.ceil(total / MIB))


def experiments_request(n: int, dims: Dims, pr_factors: int, cpu_seconds: float) -> Request:
    """pathway_experiments: the awareness probes read one clean layer per worker; the layer-K fits read the
    clean layer, the two patched, the answer-only and the 2F reweighted states at once."""
    threads = threads_for(cpu_seconds, dims.layers)
    layer_k_arrays = 1 + 3 + 2 * pr_factors
    main = worker_bytes(n, dims.hidden, layer_k_arrays)
    total = BASE_MB * MIB + main + threads * worker_bytes(n, dims.hidden, 1)
    return Request(threads, math.ceil(total / MIB))


# probe_deltap's one-thread CPU-seconds per (layer x fit x row x hidden unit) where benchmarks/cpu_cost.tsv
# has no row: issue 41's figure, 35 s per layer at N 14,267, D 4,096, 15 fits (synthetic states, one thread)
ISSUE_PROBE_RATE = 35.0 / (15 * 14_267 * 4_096)
CPU_COST = Path(__file__).resolve().parents[2] / "benchmarks" / "cpu_cost.tsv"


def read_rows(path: Path, required_columns: list[str]) -> list[dict]:
    """A benchmark TSV's rows as dicts of strings (validate.read_tsv: a bad file is one line naming it); none
    where the file is absent."""
    if not path.is_file():
        return []
    return validate.read_tsv(path, required_columns, infer_schema_length=0).to_dicts()


def probe_rate(path: Path | None = None) -> tuple[float, bool, str]:
    """(one-thread CPU-seconds per layer x fit x row x hidden unit of a probe, measured?, basis): the
    largest probe_deltap row of cpu_cost.tsv measured with one worker, else issue 41's figure."""
    rows = read_rows(CPU_COST if path is None else path, ["rule", "threads", "n", "layers", "hidden", "fits"])
    one_thread = [r for r in rows if r["rule"] == "probe_deltap" and int(r["threads"]) == 1]
    if not one_thread:
        return ISSUE_PROBE_RATE, False, "issue 41: 35 s per layer, one thread, N 14,267, D 4,096, 15 fits"
    row = max(one_thread, key=lambda r: int(r["n"]) * int(r["layers"]) * int(r["hidden"]))
    size = int(row["layers"]) * int(row["fits"]) * int(row["n"]) * int(row["hidden"])
    shape = f"N {int(row['n']):,}, {row['layers']} layers, D {row['hidden']}, {row['fits']} fits"
    return float(row["cpu_seconds"]) / size, True, f"cpu_cost.tsv: {shape}, {row['machine']}, {row['date']}"


def fits_per_layer(probe: dict) -> int:
    """Probe fits per layer: one per seed and fold."""
    return len(probe["seeds"]) * n_folds(probe["test_size"])


def requests(config: dict, model: str, dataset: str) -> dict[str, Request]:
    """The requests of a run's probe_deltap and pathway_experiments; one thread and BASE_MB where the
    model's dimensions are not known before it is prepared (an embedded model)."""
    from .diskplan import dataset_rows, model_dims

    dims = model_dims(model, config["models"][model])
    if dims is None:
        return dict.fromkeys(("probe_deltap", "pathway_experiments"), Request(1, BASE_MB))
    pw = config["pathways"]
    n, rate = dataset_rows(config, dataset), probe_rate()[0]
    per_layer = rate * fits_per_layer(pw["probe"]) * n * dims.hidden
    draws, factors = pw["knockout"]["control_draws"], len(pw["experiments"]["pr_factors"])
    return {
        "probe_deltap": probe_request(n, dims, draws, per_layer * dims.layers),
        # the awareness probes (one per other layer, one seed's folds each) dominate
        "pathway_experiments": experiments_request(n, dims, factors, per_layer * dims.layers),
    }
