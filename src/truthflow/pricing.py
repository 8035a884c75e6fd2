"""What a run costs, priced before it runs (`truthflow.bill` prints it): per model, dataset and stage the
GPU-seconds on a card, the CPU-seconds of the analysis jobs and the threads and memory they request, the disk
written and still held at the end, peak GPU memory and RAM; each figure measured (where and when) or estimated
(on what basis).

GPU: benchmarks/throughput.tsv (samples/s per shape, stage and card; bench_job.py --record appends). A model
measured under its own name on the card uses its rows; any other is scaled from the measured shape nearest in
the parameters a token runs through. A model on g GPUs costs g GPU-hours per hour. The knockout is scaled to
the config's control draws (one pass per condition: clean, E_Q and each draw, `knockout_passes`). A stage
without a GPU row is its shape's knockout times the larger of two ratios: its FLOPs over the knockout's
(`FLOP_PASSES`) and the ratio measured between the two stages on a CPU twin (benchmarks/stage_ratios.tsv).
Answers: decode steps, each reading the weights and every row's KV cache (`truthflow.decoding_cost`): the
engine's fitted on the card's measured answers rows; vLLM's (generation.backend, models.<name>.backend) from
the card's datasheet figures at stated shares, estimated, each line with the engine's figure beside it.
CPU: probe_deltap and pathway_experiments cost fixed + per layer x L one-thread CPU-seconds fitted on
cpu_cost.tsv's rows and scaled to the job's N x D x fits (`sizing.cpu_estimate`: estimated), measured only
where a row has the job's very shape (`sizing.JOB_SHAPE`: cpu_cost.tsv's, or a finished run's benchmark
table, `FinishedRun`); tables and plots a guess. An analysis job runs
the threads its rule requests (`sizing.requests`), one layer's fits per worker, so its wall seconds are about
its CPU-seconds over its threads (a lower bound: the workers share memory bandwidth, and L layers over t
workers take ceil(L / t) rounds).
Disk: `truthflow.diskplan` (sizes, removal, the simulated peak, given `job_seconds`)."""

from __future__ import annotations

import datetime
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from . import diskplan, judge_cost, memplan, registry, sizing, weights_cost
from .config import check_config, fill_defaults, schema_defaults
from .cost_lines import Cost, Figure
from .decoding_cost import (
    AnswersPrice,
    active_params,
    answers_backend,
    answers_price,
    step_cost,
    verdict_price,
)
from .errors import TruthflowError
from .memplan import Dims, dims_for, fit_to_memory, plan_model

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
THROUGHPUT, RATIOS = BENCH / "throughput.tsv", BENCH / "stage_ratios.tsv"
PAPER_CONFIGS = [REPO / "configs" / "paper-pathways.yaml", REPO / "configs" / "paper-depth.yaml"]
# the measured shapes' public dimensions (benchmarks/shapes.py builds them from the same numbers)
SHAPE_HUB = {
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B",
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-32b": "Qwen/Qwen3-32B",
}
PATHWAYS = ("answers", "saliency", "knockout", "patching", "answer-only", "reweighting", "P(True)")
DEPTH = ("MIN-K%", "answers")
CPU_STAGES = sizing.ANALYSIS_RULES  # the stages priced in CPU-seconds: the analysis jobs
RULE = {
    "answers": "generate_answers",
    "saliency": "extract_pathways",
    "knockout": "extract_pathways",
    "patching": "extract_experiments",
    "answer-only": "extract_experiments",
    "reweighting": "extract_experiments",
    "P(True)": "extract_experiments",
    "MIN-K%": "score_mink",
}
# a stage's FLOPs per sample in full passes, over the knockout stage's `knockout_passes` at the schema's draws
# (the five that throughput.tsv's knockout rows measure): saliency a forward and a backward pass (3 passes);
# patching 2 passes to layer K = L/2; answer-only one pass to K over the answer; reweighting 2 per factor to
# K; P(True) one pass; MIN-K% one pass over the question
FLOP_PASSES = {
    "saliency": 3,
    "patching": 1,
    "answer-only": 1 / 2,
    "reweighting": None,
    "P(True)": 1,
    "MIN-K%": 1 / 2,
}
TABLE_SECONDS = 60.0  # a table or plot job: a guess (small parquet files)


def figures(rows: list[dict], card: str) -> dict[str, dict[str, dict]]:
    """{shape: {stage: row}} on the card; the last row of a (shape, stage) wins (the newest)."""
    out: dict = defaultdict(dict)
    for r in rows:
        if r["card"] == card:
            out[r["shape"]][r["stage"]] = {
                **r,
                "samples_per_s": float(r["samples_per_s"]),
                "max_new_tokens": int(r["max_new_tokens"]),
            }
    return dict(out)


def default_card(rows: list[dict]) -> str | None:
    counts: dict = defaultdict(int)
    for r in rows:
        counts[r["card"]] += 1
    return max(counts, key=counts.get) if counts else None


def shape_dims(shape: str) -> Dims | None:
    found = dims_for(shape, {"hub": SHAPE_HUB[shape]}) if shape in SHAPE_HUB else None
    return found[0] if found else None


def basis(name: str, dims: Dims, measured: dict, shapes: Mapping[str, Dims]) -> tuple[str, float, bool]:
    """(measured shape, factor on its time per sample, estimated?) of a model."""
    if name in measured:
        return name, 1.0, False
    known = [s for s in measured if s in shapes]
    if not known:
        raise TruthflowError(f"no measured shape with known dimensions to scale '{name}' from")
    shape = min(known, key=lambda s: abs(math.log(active_params(dims) / active_params(shapes[s]))))
    return shape, active_params(dims) / active_params(shapes[shape]), True


def read_ratios(path: Path = RATIOS) -> dict[str, tuple[float, str]]:
    """stage -> (ratio to the knockout, where) of the committed twin measurement."""
    return {
        r["stage"]: (float(r["ratio_to_knockout"]), f"{r['shape']} twin, {r['machine']}, {r['date']}")
        for r in sizing.read_rows(path, ["stage"])
    }


def stage_ratio(stage: str, config: dict, ratios: Mapping[str, tuple[float, str]]) -> tuple[float, str]:
    """(ratio to the knockout stage at the schema's draws, its basis): the larger of FLOPs and the twin's."""
    factors = len(config["pathways"]["experiments"]["pr_factors"])
    passes = FLOP_PASSES[stage] if FLOP_PASSES[stage] is not None else factors
    flop = passes / knockout_passes(schema_defaults("pathways", "knockout")["control_draws"])
    twin, where = ratios.get(stage, (0.0, ""))
    if twin > flop:
        return twin, f"knockout x {twin:.2f}, the ratio measured on a {where} (FLOP ratio {flop:.2f})"
    extra = f"; twin ratio {twin:.2f}" if where else ""
    return flop, f"knockout x {flop:.2f}, the FLOP ratio{extra}"


def knockout_passes(control_draws: int) -> int:
    """Passes per sample of the knockout stage: the clean condition, E_Q and each control draw, one engine run
    (`pathways.extract.knockout_states`)."""
    return 2 + control_draws


@dataclass(frozen=True)
class FinishedRun:
    """A finished run's benchmark table (results/<run>/tables/benchmarks.tsv): its rows by job (rule, model,
    dataset), each with the job's shape, and the basis its figures are labelled with."""

    path: Path
    rows: dict[tuple[str, str, str], dict]
    basis: str

    @classmethod
    def load(cls, path: Path, run: str) -> FinishedRun:
        rows = sizing.read_rows(path, ["rule", "model", "dataset", "cpu_seconds"])
        date = datetime.date.fromtimestamp(path.stat().st_mtime).isoformat()
        by_job = {(r["rule"], r["model"], r["dataset"]): r for r in rows}
        return cls(path, by_job, f"finished run {run}, {path.name}, {date}")

    def row(self, rule: str, model: str, dataset: str, shape: Mapping[str, int]) -> dict | None:
        """The job's row where it ran at this shape (`sizing.at_shape`) and took CPU time, else None."""
        row = self.rows.get((rule, model, dataset))
        same = row is not None and sizing.at_shape(row, shape)
        return row if same and row["cpu_seconds"] not in (None, "", "NA") else None


def cpu_costs(
    config: dict, model: str, dataset: str, cpu_rows: list[dict], finished: FinishedRun | None = None
) -> list[Cost]:
    """probe_deltap and pathway_experiments of one run: one-thread CPU-seconds (`sizing.cpu_estimate`;
    measured where cpu_cost.tsv or the finished run has a row at the job's shape, the run's first), and the
    threads and memory their rules request (`sizing.requests`: the RAM column is that request)."""
    d = diskplan.model_dims(model, config["models"][model])
    n = diskplan.dataset_rows(config, dataset)
    fits = sizing.fits_per_layer(config["pathways"]["probe"])
    requests = sizing.requests(config, model, dataset)
    out = []
    for rule in CPU_STAGES:
        shape = sizing.job_shape(config, rule, model, dataset)
        value, text = sizing.cpu_estimate(rule, n, d, fits, cpu_rows)
        seconds = Figure(value, False, text)
        if row := sizing.measured_row(rule, shape, cpu_rows):
            text = f"cpu_cost.tsv at the job's shape: {row['machine']}, {row['date']}"
            seconds = Figure(float(row["cpu_seconds"]), True, text)
        if finished and (row := finished.row(rule, model, dataset, shape)):
            seconds = Figure(float(row["cpu_seconds"]), True, finished.basis)
        request = requests[rule]
        ram = Figure(request.mem_mb / 1024, False, "the rule's mem_mb request (truthflow.sizing)")
        out.append(
            Cost(model, dataset, rule, rule, cpu_seconds=seconds, ram_gib=ram, threads=request.threads)
        )
    return out


@dataclass
class Setting:
    """What the pricing reads beside the config: measured rows on the card, twin ratios, CPU rows."""

    card: str
    measured: dict[str, dict[str, dict]]
    ratios: dict[str, tuple[float, str]]
    cpu_rows: list[dict]
    shapes: dict[str, Dims]

    @property
    def step(self) -> tuple[float, float]:
        """The card's decode step cost (`step_cost`) from every measured answers row of a known shape."""
        rows = [
            (self.shapes[s], r["answers"])
            for s, r in self.measured.items()
            if "answers" in r and s in self.shapes
        ]
        if not rows:
            raise TruthflowError(f"no measured answers row on {self.card} to price decoding with")
        return step_cost(rows)

    @classmethod
    def load(
        cls, card: str | None = None, shapes: Mapping[str, Dims] | None = None, rows: list[dict] | None = None
    ) -> Setting:
        """The committed tables (rows: throughput rows in place of throughput.tsv's)."""
        rows = sizing.read_rows(THROUGHPUT, ["shape", "card", "stage"]) if rows is None else rows
        card = card or default_card(rows) or "no card"
        known = {s: d for s in SHAPE_HUB if (d := shape_dims(s))} | dict(shapes or {})
        return cls(card, figures(rows, card), read_ratios(), sizing.cpu_rows(), known)


def gpu_costs(config: dict, name: str, part: str, datasets: list[str], setting: Setting) -> list[Cost]:
    """Every GPU stage of one model over its datasets."""
    spec = config["models"][name]
    d = diskplan.model_dims(name, spec)
    if d is None or not setting.measured:
        why = "its dimensions are unknown" if d is None else f"no throughput rows for {setting.card}"
        raise TruthflowError(f"cannot price model '{name}': {why}")
    shape, factor, scaled = basis(name, d, setting.measured, setting.shapes)
    rows, gpus = setting.measured[shape], max(1, int(spec["gpus"]))
    pw = config["pathways"]
    saliency_batch = pw["experiments"]["saliency_batch_size"]
    jobs = {"generation", "passes"} | ({"saliency"} if part == "pathways" else set())
    mem = plan_model(name, spec, d, jobs, saliency_batch)
    kind = {"answers": "generation", "saliency": "saliency"}
    ram = Figure(
        sizing.model_job_mib(spec, d, saliency_batch) / 1024,
        False,
        "the rule's mem_mb request (sizing.model_job_mib: torch + CUDA libraries, one 5 GB weight shard, a "
        "batch of state pages)",
    )
    ko = rows["knockout"]
    measured_draws = schema_defaults("pathways", "knockout")["control_draws"]
    scaled_text = ", scaled by active params (see 'scaled')" if scaled else ""
    out = []
    for dataset in datasets:
        n = diskplan.dataset_rows(config, dataset)
        for stage in PATHWAYS if part == "pathways" else DEPTH:
            rule = "answer_depthqa" if (part, stage) == ("depth", "answers") else RULE[stage]
            line = {"gpu_mem_gib": mem[kind.get(stage, "passes")], "ram_gib": ram}
            if stage == "answers":
                price = answers_price(config, name, d, rule, dataset, setting.card, setting.step)
                gpu, line["engine_seconds"] = price.gpu_seconds, price.engine_seconds
                if price.vllm_gpu_gib is not None:
                    line["gpu_mem_gib"] = price.vllm_gpu_gib
                if answers_backend(config, rule, name) == "vllm":  # vLLM's processes on the host
                    line["ram_gib"] = Figure(
                        sizing.model_job_mib(spec, d, saliency_batch, "vllm") / 1024,
                        False,
                        "the rule's mem_mb request (sizing.model_job_mib: vLLM's processes, torch + CUDA "
                        "libraries in each, a 5 GB weight shard per GPU, or the engine's, the larger)",
                    )
                out.append(Cost(name, dataset, stage, rule, gpu_seconds=gpu, gpus=gpus, **line))
                continue
            if stage == "knockout":
                passes = knockout_passes(pw["knockout"]["control_draws"]) / knockout_passes(measured_draws)
                text = f"{shape} knockout row{scaled_text}" + (
                    f" x {passes:.2f} (control draws)" if passes != 1 else ""
                )
                per = Figure(factor * passes / ko["samples_per_s"], not scaled and passes == 1, text)
            elif stage in rows:
                per = Figure(
                    factor / rows[stage]["samples_per_s"], not scaled, f"{shape} {stage} row{scaled_text}"
                )
            else:
                ratio, text = stage_ratio(stage, config, setting.ratios)
                per = Figure(factor * ratio / ko["samples_per_s"], False, f"{text}{scaled_text}")
            gpu = Figure(per.value * n * gpus, per.measured, per.basis)
            out.append(Cost(name, dataset, stage, rule, gpu_seconds=gpu, gpus=gpus, **line))
    return out


def prepared(path: Path) -> dict:
    """A config file checked, its batch sizes fitted to memory and its defaults filled, as the Snakefile does
    (without the data, prompt and judge checks, which need the files and keys of a real run)."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise TruthflowError(f"cannot read config {path}: {exc}") from None
    fit_to_memory(raw, check_config(raw, [path]))
    return fill_defaults(raw)


def price(config: dict, setting: Setting, finished: FinishedRun | None = None) -> list[Cost]:
    """Every cost line of a prepared config; `finished`: a finished run's figures for the jobs it ran."""
    out, rates = [], weights_cost.rates()
    pw_models, depth_models = config["pathways"]["models"], config["depth"]["models"]
    files = {(r.model, r.dataset): r for r in diskplan.run_files(config)}
    keep = config["pathways"]["keep_states"]
    for name in dict.fromkeys([*pw_models, *depth_models]):
        spec = config["models"][name]
        out.append(weights_cost.weights_line(name, spec, diskplan.weights_bytes(name, spec), rates))
    qa = defaultdict(list)
    for model, dataset in diskplan.qa_runs(config):
        qa[model].append(dataset)
    for name, datasets in qa.items():
        costs = gpu_costs(config, name, "pathways", datasets, setting)
        for c in costs:
            if c.stage == "answers":
                out.append(c)
            elif (name, c.dataset) in files:
                f = files[(name, c.dataset)]
                if c.stage == "knockout":
                    resid = sum(f.resid.values())
                    c = Cost(**{**c.__dict__, "written": resid, "held": resid if keep else 0})
                if c.stage == "P(True)":  # the experiment job's files, on its last stage
                    exp = sum(f.experiments.values())
                    c = Cost(**{**c.__dict__, "written": exp, "held": exp})
                out.append(c)
        for dataset in datasets:
            if (name, dataset) in files:
                out += cpu_costs(config, name, dataset, setting.cpu_rows, finished)
    for name in depth_models:
        out += gpu_costs(config, name, "depth", [registry.DEPTHQA], setting)
    out += weights_cost.load_costs(config, out, rates)
    if judge := judge_cost.hf_work(config):  # its verdicts decode as the answers do
        verdict = verdict_price(config, judge, setting.card, setting.step)
        judged = judge_cost.hf_costs(judge, verdict.gpu_seconds.value, rates)
        out += [_on_vllm(c, verdict, judge.verdicts) if c.stage == "judge (hf)" else c for c in judged]
    tables = table_jobs(config)
    seconds = Figure(
        TABLE_SECONDS * tables, False, f"{tables} table and plot jobs x {TABLE_SECONDS:.0f} s (a guess)"
    )
    out.append(
        Cost(
            "(all)",
            "",
            "tables and plots",
            "tables",
            cpu_seconds=seconds,
            ram_gib=Figure(1.0, False, "a guess"),
        )
    )
    return out


def _on_vllm(cost: Cost, verdict: AnswersPrice, verdicts: int) -> Cost:
    """An hf judge's line (`judge_cost.hf_costs`, which labels the engine's decode model) where vLLM gives its
    verdicts: with vLLM's basis and the engine's figure beside it, or with why the engine's figures stand."""
    value, engine = cost.gpu_seconds.value, verdict.engine_seconds
    if not verdict.gpu_seconds.basis:
        return cost
    if engine is None:  # vLLM's verdicts at the engine's figures
        return replace(
            cost, gpu_seconds=Figure(value, False, f"{cost.gpu_seconds.basis}; {verdict.gpu_seconds.basis}")
        )
    beside = Figure(engine.value * verdicts, False, engine.basis)
    return replace(cost, gpu_seconds=Figure(value, False, verdict.gpu_seconds.basis), engine_seconds=beside)


def table_jobs(config: dict) -> int:
    """Table and plot jobs of a config: the aggregates, a figure job per pair, the HTML tables."""
    pairs = len(config["figures"]["pathways"]) if config["pathways"]["models"] else 0
    pathways = (2 + 2 * pairs) if config["pathways"]["models"] else 0
    depth = (2 if config["figures"]["depth"] else 1) if config["depth"]["models"] else 0
    return 1 + pathways + depth + 2 + 8  # accuracy, ..., compare_published and benchmark_table, HTML tables


def durations(costs: list[Cost]) -> dict[tuple[str, str, str], float]:
    """Wall seconds of each job (rule, model, dataset): a model job's GPU-seconds over its GPUs, an analysis
    job's CPU-seconds over its threads (about: see the module's docstring)."""
    out: dict = defaultdict(float)
    for c in costs:
        if c.gpu_seconds:
            out[(c.rule, c.model, c.dataset)] += c.gpu_seconds.value / c.gpus
        if c.cpu_seconds and c.rule in CPU_STAGES:
            out[(c.rule, c.model, c.dataset)] += c.cpu_seconds.value / c.threads
    return dict(out)


def job_seconds(config: dict, setting: Setting | None = None) -> dict[tuple[str, str, str], float]:
    """`durations` of a prepared config's jobs, for `diskplan.plan`; {} where it cannot be priced (the disk
    plan then orders the jobs with no durations)."""
    try:
        return durations(price(config, setting or Setting.load()))
    except TruthflowError:
        return {}


def runs_on_cpu(spec: dict) -> bool:
    """A model whose jobs run on the CPU: the memory plan's compute dtype is float32 (no GPU, or float32
    weights: the demo's CPU setting; the paper configs' models are bfloat16 on GPUs)."""
    return memplan.compute_dtype(spec) == "float32"
