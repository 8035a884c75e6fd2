"""What an analysis job costs and asks of its scheduler: one-thread CPU-seconds, threads and memory for
probe_deltap and pathway_experiments, from the shapes of the states they read (N rows, L layers, D hidden
units), so the bill prices them and a SLURM job gets the right request and a local run shares its cores
sensibly.

CPU-seconds: fixed + per layer x L (`fit_layers`), fitted on benchmarks/cpu_cost.tsv's one-thread rows of the
rule at one size (N x D x fits) and at least MIN_LAYER_COUNTS layer counts, and scaled to a job's size by
(size / fitted size) ** e, e fitted on the rule's one-thread rows of other sizes (1, linear, where there are
none). The cost grows slower than the size (the work around each fit, reading a layer, predicting the
knockout states, the bootstrap, weighs more in a small job). Both parts are assumed to grow at one power:
the rows of other sizes are too few to fit one for each.

Both jobs fit per-layer probes, side by side in `threads` worker processes (`pathways.probes.over_layers`).
A worker holds one layer of each state array it reads in float32, a training fold's scaled copy of the
clean layer and the mapped pages of the one layer it is copying (`activations.States` releases them once
copied); the job's own process holds the per-sample tables (N x L rows)."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import validate
from .memplan import BYTES, Dims, compute_dtype, host_mib, vllm_host_mib
from .pathways.probes import n_folds
from .runlog import JOB_SHAPE

# a job long enough to want workers: its one-thread CPU time over this many seconds asks for one more
SECONDS_PER_THREAD = 600
# the most workers a job asks for: more share one machine's memory bandwidth, which the fits are bound by
MAX_THREADS = 8
FLOAT32 = 4
MIB = 2**20
# the job's own process: Python, numpy, polars and scikit-learn, before any state is read
BASE_MB = 1_000
# each worker process of a job with threads > 1 (`pathways.probes.over_layers`): its own Python, numpy and
# scikit-learn, about 190 MiB on x86_64; counted per process, as sites that enforce RSS sum their processes'
WORKER_BASE_MB = 250
# the largest memory page of a Linux node (arm64's 64 KiB; x86-64's 4 KiB): a part of a mapped file that
# starts or ends mid-page holds the whole page, and a read fault maps up to 64 KiB around it (fault-around)
PAGE_BYTES = 64 * 1024
# a probe's cross-fit beside the layers it fits and scores, in float32 layers: the training fold's copy and
# its scaled copy, StandardScaler's float64 temporaries, and a test fold of each array (1 / 5 folds). Peaks
# over the arrays held (ru_maxrss; N 4,000-14,267, D 1,024-4,096): 2.8-3.7 layers with 1 array, 3.6-4.5 with 5
FIT_LAYERS = 3.5
TEST_FOLD_LAYERS = 0.2
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


def mapped_read_bytes(n: int, hidden: int, itemsize: int = FLOAT32) -> int:
    """The pages of the state files a reader holds at once: the one [N, D] layer it is copying out of its
    file (one block, the files being layer-major) and a page at either end. `activations.States` releases
    a map's pages once the part is copied, so one layer of one array is mapped at a time (float32: the
    widest storage)."""
    return n * hidden * itemsize + 2 * PAGE_BYTES


def mapped_write_bytes(batch_rows: int, layers: int, hidden: int, itemsize: int) -> int:
    """The pages of the state files a model job's writer holds at once: one array's batch, batch_rows samples
    x `layers` layers (1 for the experiment files' [N, D]) of `hidden` values of `itemsize` bytes. In the
    layer-major resid files each (sample, layer) row is a run of its own, on whole pages (PAGE_BYTES, one
    more where it starts mid-page); `activations.States` releases an array's pages once its batch is
    stored, so one array's batch is mapped at a time."""
    row_pages = math.ceil(hidden * itemsize / PAGE_BYTES) + 1
    return batch_rows * layers * row_pages * PAGE_BYTES


def model_job_mib(spec: dict, dims: Dims | None, saliency_batch: int = 1, backend: str = "engine") -> int:
    """A model job's host memory request (MiB), as the bill's RAM column shows it: loading and its passes
    (`memplan.host_mib`) and the state files' pages its writer holds at once (`mapped_write_bytes`, a batch
    of batch_size rows over every layer in the dtype the model computes in). An answers job whose backend is
    vllm: the larger of that and vLLM's processes (`memplan.vllm_host_mib`), as the engine answers where vLLM
    refuses the model."""
    loading = host_mib(spec, dims, saliency_batch)
    if dims is None:
        return loading
    itemsize = BYTES.get(compute_dtype(spec), 2)
    writes = mapped_write_bytes(int(spec["batch_size"]), dims.layers, dims.hidden, itemsize)
    engine = loading + math.ceil(writes / MIB)
    return max(engine, vllm_host_mib(spec, dims)) if backend == "vllm" else engine


def worker_bytes(n: int, hidden: int, arrays: int) -> int:
    """One worker's peak: one layer of each of `arrays` state arrays in float32, and beside them either the
    mapped pages of the layer it is copying (`mapped_read_bytes`, while it reads) or the fit's workspace
    (FIT_LAYERS and a test fold of each array, once all are read), whichever is larger."""
    layer = n * hidden * FLOAT32
    fit = math.ceil((FIT_LAYERS + TEST_FOLD_LAYERS * arrays) * layer)
    return arrays * layer + max(mapped_read_bytes(n, hidden), fit)


def processes_bytes(threads: int) -> int:
    """The job's processes before any state: its own, and its workers' where it starts them (threads > 1)."""
    return (BASE_MB + (threads * WORKER_BASE_MB if threads > 1 else 0)) * MIB


def probe_request(n: int, dims: Dims, control_draws: int, cpu_seconds: float) -> Request:
    """probe_deltap: the clean layer, the target knockout's and each control draw's."""
    threads = threads_for(cpu_seconds, dims.layers)
    arrays = 2 + control_draws
    tables = 2 * n * dims.layers * TABLE_BYTES_PER_ROW
    total = processes_bytes(threads) + threads * worker_bytes(n, dims.hidden, arrays) + tables
    return Request(threads, math.ceil(total / MIB))


def experiments_request(n: int, dims: Dims, pr_factors: int, cpu_seconds: float) -> Request:
    """pathway_experiments: the awareness probes read one clean layer per worker; the layer-K fits read the
    clean layer, the two patched, the answer-only and the 2F reweighted states at once."""
    threads = threads_for(cpu_seconds, dims.layers)
    layer_k_arrays = 1 + 3 + 2 * pr_factors
    main = worker_bytes(n, dims.hidden, layer_k_arrays)
    total = processes_bytes(threads) + main + threads * worker_bytes(n, dims.hidden, 1)
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


def write_rows(path: Path, columns: Sequence[str], rows: list[dict]) -> None:
    """A benchmark TSV (`read_rows` reads it back): a header of `columns`, a line per row in that order."""
    with path.open("w", newline="") as handle:
        out = csv.DictWriter(handle, columns, delimiter="\t", lineterminator="\n")
        out.writeheader()
        out.writerows(rows)


def cpu_rows(path: Path | None = None) -> list[dict]:
    """cpu_cost.tsv's rows (`CPU_COST`, or the file at path)."""
    return read_rows(CPU_COST if path is None else path, ["rule", *JOB_SHAPE, "cpu_seconds"])


def size(row: Mapping) -> int:
    """N x D x fits of a row or shape: what one layer's probes cost in proportion to."""
    return int(row["n"]) * int(row["hidden"]) * int(row["fits"])


def describe(row: Mapping) -> str:
    return f"N {int(row['n']):,}, D {int(row['hidden']):,}, {row['fits']} fits"


def probe_rate(rows: list[dict] | None = None) -> tuple[float, str]:
    """(one-thread CPU-seconds per layer x fit x row x hidden unit of a probe, basis): the largest one-worker
    probe_deltap row of cpu_cost.tsv, else issue 41's figure: `cpu_estimate`'s where a rule's rows do not
    reach MIN_LAYER_COUNTS layer counts."""
    rows = cpu_rows() if rows is None else rows
    one_thread = [r for r in rows if r["rule"] == "probe_deltap" and int(r["threads"]) == 1]
    if not one_thread:
        return ISSUE_PROBE_RATE, "issue 41: 35 s per layer, one thread, N 14,267, D 4,096, 15 fits"
    row = max(one_thread, key=lambda r: size(r) * int(r["layers"]))
    shape = f"{describe(row)}, {row['layers']} layers"
    per_unit = float(row["cpu_seconds"]) / (size(row) * int(row["layers"]))
    return per_unit, f"cpu_cost.tsv's probe_deltap row at {shape}: {row['machine']}, {row['date']}"


# a fit of fixed + per-layer cost needs one-thread rows at one size and this many layer counts
MIN_LAYER_COUNTS = 3


def fit_layers(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(fixed, per layer): the least-squares line CPU-seconds = fixed + per layer x layers through
    (layers, CPU-seconds) points of two layer counts or more."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if not sxx:
        raise ValueError(f"a line over layers needs two layer counts or more, not {sorted(set(xs))}")
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx, slope


@dataclass(frozen=True)
class LayerCost:
    """One-thread CPU-seconds of a rule: fixed + per_layer x L at `size` (N x D x fits of the rows fitted),
    times (a job's size / size) ** exponent."""

    fixed: float
    per_layer: float
    size: int
    exponent: float
    basis: str

    def seconds(self, n: int, layers: int, hidden: int, fits: int) -> float:
        scale = (n * hidden * fits / self.size) ** self.exponent
        return (self.fixed + self.per_layer * layers) * scale


def layer_cost(rule: str, rows: list[dict]) -> LayerCost | None:
    """`rule`'s fixed and per-layer cost fitted on its one-thread rows at one size (the largest with
    MIN_LAYER_COUNTS layer counts), and the exponent of its growth in size: the least-squares slope through
    the origin of log(CPU-seconds / the line's) against log(size / the fitted size) over its one-thread rows
    of other sizes (1, linear, where there are none); None where no size has enough layer counts."""
    one_thread = [r for r in rows if r["rule"] == rule and int(r["threads"]) == 1]
    groups: dict[tuple[int, int, int], list[dict]] = {}
    for r in one_thread:
        groups.setdefault((int(r["n"]), int(r["hidden"]), int(r["fits"])), []).append(r)
    fittable = [g for g in groups.values() if len({int(r["layers"]) for r in g}) >= MIN_LAYER_COUNTS]
    if not fittable:
        return None
    group = max(fittable, key=lambda g: size(g[0]))
    fixed, per_layer = fit_layers([(int(r["layers"]), float(r["cpu_seconds"])) for r in group])
    others = [r for r in one_thread if size(r) != size(group[0])]
    points = [
        (math.log(size(r) / size(group[0])), math.log(float(r["cpu_seconds"]) / line))
        for r in others
        if (line := fixed + per_layer * int(r["layers"])) > 0
    ]
    exponent = sum(x * y for x, y in points) / sum(x * x for x, _ in points) if points else 1.0
    layers = sorted({int(r["layers"]) for r in group})
    growth = (
        f"x (N x D x fits over its) ^ {exponent:.2f}, the power fitted on its rows at "
        + "; ".join(sorted({f"{describe(r)}, {r['layers']} layers" for r in others}))
        if points
        else "x N x D x fits over its (no row of another size)"
    )
    basis = (
        f"{fixed:,.1f} + {per_layer:,.2f} x L CPU-s, fitted on cpu_cost.tsv's one-thread {rule} rows at "
        f"{describe(group[0])}, {', '.join(map(str, layers))} layers ({group[-1]['date']}), {growth}"
    )
    return LayerCost(fixed, per_layer, size(group[0]), exponent, basis)


def cpu_estimate(
    rule: str, n: int, dims: Dims, fits: int, rows: list[dict] | None = None
) -> tuple[float, str]:
    """(one-thread CPU-seconds, basis) of an analysis job on N rows of a model of `dims`, `fits` probe fits
    per layer: `layer_cost` where cpu_cost.tsv has the rows, else the probe rate (`probe_rate`) per fit x L
    layers (probe_deltap) or L + 3 layers (pathway_experiments: its awareness probes and about four layer-K
    fits)."""
    rows = cpu_rows() if rows is None else rows
    if cost := layer_cost(rule, rows):
        return cost.seconds(n, dims.layers, dims.hidden, fits), cost.basis
    rate, where = probe_rate(rows)
    layers, text = (dims.layers, "L") if rule == "probe_deltap" else (dims.layers + 3, "L + 3")
    return rate * layers * fits * n * dims.hidden, f"{text} layers x fits x N x D at {where}"


def at_shape(row: Mapping, shape: Mapping[str, int]) -> bool:
    """Whether a benchmark row (its TSV's text) was measured at this job shape: every JOB_SHAPE column equal;
    never for no shape ({}: not an analysis job)."""
    return bool(shape) and all(str(shape[k]) == row.get(k) for k in JOB_SHAPE)


def measured_row(rule: str, shape: Mapping[str, int], rows: list[dict]) -> dict | None:
    """The newest cpu_cost.tsv row of `rule` measured at exactly this shape (`at_shape`), or None."""
    same = [r for r in rows if r["rule"] == rule and at_shape(r, shape)]
    return same[-1] if same else None


def fits_per_layer(probe: dict) -> int:
    """Probe fits per layer: one per seed and fold."""
    return len(probe["seeds"]) * n_folds(probe["test_size"])


ANALYSIS_RULES = ("probe_deltap", "pathway_experiments")


def requests(config: dict, model: str, dataset: str) -> dict[str, Request]:
    """The requests of a run's probe_deltap and pathway_experiments (threads from `cpu_estimate`); one
    thread and BASE_MB where the model's dimensions are unknown before it is prepared (an embedded model)."""
    from .diskplan import dataset_rows, model_dims

    dims = model_dims(model, config["models"][model])
    if dims is None:
        return dict.fromkeys(ANALYSIS_RULES, Request(1, BASE_MB))
    pw, rows = config["pathways"], cpu_rows()
    n, fits = dataset_rows(config, dataset), fits_per_layer(pw["probe"])
    seconds = {rule: cpu_estimate(rule, n, dims, fits, rows)[0] for rule in ANALYSIS_RULES}
    draws, factors = pw["knockout"]["control_draws"], len(pw["experiments"]["pr_factors"])
    return {
        "probe_deltap": probe_request(n, dims, draws, seconds["probe_deltap"]),
        "pathway_experiments": experiments_request(n, dims, factors, seconds["pathway_experiments"]),
    }


def job_shape(config: dict, rule: str, model: str, dataset: str | None = None) -> dict[str, int]:
    """An analysis job's shape (JOB_SHAPE), as the bill prices it and the benchmark table records it: its
    dataset's rows (`diskplan.dataset_rows`), the model's layers and hidden size, probe fits per layer and
    the threads its rule requests; {} for any other job, or a model whose dimensions are unknown."""
    from .diskplan import dataset_rows, model_dims

    dims = model_dims(model, config["models"][model]) if rule in ANALYSIS_RULES else None
    if dims is None:
        return {}
    return {
        "n": dataset_rows(config, dataset),
        "layers": dims.layers,
        "hidden": dims.hidden,
        "fits": fits_per_layer(config["pathways"]["probe"]),
        "threads": requests(config, model, dataset)[rule].threads,
    }
