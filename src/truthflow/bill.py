"""The bill of a run before it runs: per model and stage, GPU-hours on the card, CPU-hours of the analysis
jobs, disk written and still held at the end, peak GPU memory and RAM; each figure measured (where and when)
or estimated (on what basis), and the totals with the estimated part named.

    python -m truthflow.bill                                 # both paper configs
    python -m truthflow.bill config.yaml --gpu-slots 2       # any config

GPU: benchmarks/throughput.tsv (samples/s per shape, stage and card; bench_job.py --record appends). A model
measured under its own name on the card uses its rows; any other is scaled from the measured shape nearest in
the parameters a token runs through. A model on g GPUs costs g GPU-hours per hour. The knockout is scaled to
the config's control draws (one pass per condition). A stage without a GPU row is its shape's knockout times
the larger of two ratios: its FLOPs over the knockout's (`FLOP_RATIO`) and the ratio measured between the two
stages on a CPU twin (benchmarks/stage_ratios.tsv). Answers: a decode step reads the weights and every row's
KV cache; the step's seconds per byte are calibrated on the shape's measured answers row, and the answers of a
run are priced step by step at the context each step reaches (prompt + up to max_new_tokens, every answer
running to the cap: an upper bound) and at the batch the model's batch_size and token budget give.
CPU: probe_deltap costs layers x fits x N x D (benchmarks/cpu_cost.tsv's measured rate where present, else
issue 41's 35 s per layer at N 14,267, D 4,096, 15 fits, one thread); pathway_experiments its awareness probes
(one per other layer) and about four layer-K fits at the same rate; tables and plots a guess.
Disk: `truthflow.diskplan` (sizes, removal, the simulated peak)."""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import diskplan, registry
from .config import check_config, fill_defaults, schema_defaults
from .errors import TruthflowError
from .memplan import BYTES, GIB, Dims, dims_for, fit_to_memory, plan_model
from .pathways.probes import n_folds

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
THROUGHPUT, RATIOS, CPU_COST = (BENCH / f for f in ("throughput.tsv", "stage_ratios.tsv", "cpu_cost.tsv"))
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
CPU_STAGES = ("probe_deltap", "pathway_experiments")
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
# a stage's FLOPs per sample over the knockout stage's (the schema's E_Q + 3 control passes, all layers):
# saliency a forward and a backward pass (3 passes); patching 2 passes to layer K = L/2; answer-only one pass
# to K over the answer; reweighting 2 per factor to K; P(True) one pass; MIN-K% one pass over the question
FLOP_RATIO = {
    "saliency": 3 / 4,
    "patching": 1 / 4,
    "answer-only": 1 / 8,
    "reweighting": None,
    "P(True)": 1 / 4,
    "MIN-K%": 1 / 8,
}
# prompt tokens of a question (a chat template adds CHAT_TOKENS); issue 32's answers rows: prompts 16-256
PROMPT_TOKENS = {"popqa": 24, "triviaqa": 32, "hotpotqa": 40, "nq": 24, "depthqa": 120}
CHAT_TOKENS = 40
BENCH_JOB_PROMPT = 16  # bench_job.py's questions: 6-20 one-id words between BOS, "Q:" and "A:"
# issue 41: run_probes took 35 s per layer on one thread at N 14,267, D 4,096, 3 seeds x 5 folds
ISSUE_PROBE = {"seconds": 35.0, "n": 14_267, "hidden": 4_096, "fits": 15}
TABLE_SECONDS = 60.0  # a table or plot job: a guess (small parquet files)
JOB_RAM_GIB = 2.5  # torch and the CUDA libraries in a model job's process
SHARD_BYTES = 5e9  # from_pretrained loads one safetensors shard at a time (the hub's shards are <= 5 GB)


@dataclass(frozen=True)
class Figure:
    value: float
    measured: bool
    basis: str

    def __add__(self, other: Figure) -> Figure:
        basis = self.basis if self.basis == other.basis else f"{self.basis}; {other.basis}"
        return Figure(self.value + other.value, self.measured and other.measured, basis)


@dataclass(frozen=True)
class Cost:
    """One stage of one model on one dataset (dataset "" for the model's weights)."""

    model: str
    dataset: str
    stage: str
    rule: str
    gpu_seconds: Figure | None = None  # GPU-seconds (wall seconds x the model's GPUs)
    cpu_seconds: Figure | None = None
    written: int = 0
    held: int = 0
    gpu_mem_gib: float | None = None
    ram_gib: Figure | None = None
    gpus: int = 1


def read_tsv(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    lines = [line.split("\t") for line in path.read_text().splitlines() if line.strip()]
    return [dict(zip(lines[0], line, strict=True)) for line in lines[1:]]


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


def active_params(d: Dims) -> int:
    """Parameters a token passes through: a mixture of experts runs experts_per_token of its experts."""
    return d.params - d.layers * (d.experts - d.experts_per_token) * 3 * d.hidden * d.intermediate


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


def kv_bytes(d: Dims, dtype: str) -> int:
    """KV-cache bytes of one token over all layers."""
    return 2 * d.layers * d.kv_heads * d.head_dim * BYTES.get(dtype, 2)


def decode_work(d: Dims, dtype: str, batch: int, prompt: float, new: int) -> float:
    """Bytes read per answer over its `new` decode steps at `batch` rows: each step reads the weights (shared
    by the batch) and the row's KV cache of prompt + s tokens: new W / batch + kv (new p + new (new + 1) / 2).
    """
    weights = d.params * BYTES.get(dtype, 2)
    return new * weights / batch + kv_bytes(d, dtype) * (new * prompt + new * (new + 1) / 2)


def decode_batch(batch_size: int, token_budget: int, prompt: float, new: int) -> int:
    """Rows of a generation batch: batch_size, or fewer where rows x (prompt + new) exceeds the budget."""
    return max(1, min(batch_size, int(token_budget // (prompt + new))))


def measured_decode(row: dict) -> tuple[int, float, int]:
    """(batch, mean prompt tokens, new tokens) of a measured answers row, from its settings."""
    settings = row.get("settings", "")
    batch = int(m.group(1)) if (m := re.search(r"batch (\d+)", settings)) else 1
    budget = int(m.group(1)) if (m := re.search(r"token budget (\d+)", settings)) else 32_768
    got = re.search(r"prompts (\d+)-(\d+) tokens", settings)
    prompt = (int(got.group(1)) + int(got.group(2))) / 2 if got else BENCH_JOB_PROMPT
    new = row["max_new_tokens"]
    return decode_batch(batch, budget, prompt, new), prompt, new


def step_cost(rows: list[tuple[Dims, dict]]) -> tuple[float, float]:
    """(seconds per decode step, seconds per byte read) fitted on measured answers rows (least squares over
    their mean step time against the bytes a step reads; one row: no fixed part)."""
    points = []
    for d, row in rows:
        batch, prompt, new = measured_decode(row)
        step = batch / row["samples_per_s"] / new
        points.append((decode_work(d, row.get("dtype", "bfloat16"), batch, prompt, new) * batch / new, step))
    if len(points) == 1:
        ((x, y),) = points
        return 0.0, y / x
    mx, my = (sum(p[i] for p in points) / len(points) for i in (0, 1))
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    fixed = my - slope * mx
    return (fixed, slope) if fixed >= 0 and slope > 0 else (0.0, my / mx)


def answers_seconds(
    d: Dims, dtype: str, batch: int, prompt: float, new: int, cost: tuple[float, float]
) -> float:
    """GPU wall seconds of one answer: its share of `new` decode steps at `batch` rows, each a fixed part
    and the bytes it reads (`step_cost`)."""
    fixed, per_byte = cost
    return new * fixed / batch + per_byte * decode_work(d, dtype, batch, prompt, new)


def read_ratios(path: Path = RATIOS) -> dict[str, tuple[float, str]]:
    """stage -> (ratio to the knockout, where) of the committed twin measurement."""
    return {
        r["stage"]: (float(r["ratio_to_knockout"]), f"{r['shape']} twin, {r['machine']}, {r['date']}")
        for r in read_tsv(path)
    }


def stage_ratio(stage: str, config: dict, ratios: Mapping[str, tuple[float, str]]) -> tuple[float, str]:
    """(ratio to the knockout stage at the schema's draws, its basis): the larger of FLOPs and the twin's."""
    factors = len(config["pathways"]["experiments"]["pr_factors"])
    flop = FLOP_RATIO[stage] if FLOP_RATIO[stage] is not None else factors / 4
    twin, where = ratios.get(stage, (0.0, ""))
    if twin > flop:
        return twin, f"knockout x {twin:.2f}, the ratio measured on a {where} (FLOP ratio {flop:.2f})"
    extra = f"; twin ratio {twin:.2f}" if where else ""
    return flop, f"knockout x {flop:.2f}, the FLOP ratio{extra}"


def probe_rate(cpu_rows: list[dict]) -> tuple[float, bool, str]:
    """(CPU-seconds per layer x fit x row x hidden unit, measured?, basis) of probe_deltap at the schema's
    fits: the largest measured row of cpu_cost.tsv, else issue 41's figure."""
    probe = schema_defaults("pathways", "probe")
    fits = len(probe["seeds"]) * n_folds(probe["test_size"])
    rows = [r for r in cpu_rows if r["rule"] == "probe_deltap"]
    if rows:
        r = max(rows, key=lambda r: int(r["n"]) * int(r["layers"]) * int(r["hidden"]))
        size = int(r["layers"]) * fits * int(r["n"]) * int(r["hidden"])
        shape = f"N {int(r['n']):,}, {r['layers']} layers, D {r['hidden']}"
        where = f"cpu_cost.tsv: {shape}, {r['machine']}, {r['date']}"
        return float(r["cpu_seconds"]) / size, True, where
    i = ISSUE_PROBE
    text = (
        f"issue 41: 35 s per layer, one thread, N {i['n']:,}, D {i['hidden']:,}, {i['fits']} fits (synthetic)"
    )
    return i["seconds"] / (i["fits"] * i["n"] * i["hidden"]), False, text


def measured_rule(cpu_rows: list[dict], rule: str) -> dict | None:
    rows = [r for r in cpu_rows if r["rule"] == rule]
    return max(rows, key=lambda r: int(r["n"]) * int(r["layers"]) * int(r["hidden"])) if rows else None


def cpu_costs(config: dict, model: str, dataset: str, d: Dims, n: int, cpu_rows: list[dict]) -> list[Cost]:
    """probe_deltap and pathway_experiments of one run: CPU-seconds and peak RAM."""
    pw = config["pathways"]
    fits = len(pw["probe"]["seeds"]) * n_folds(pw["probe"]["test_size"])
    rate, measured, where = probe_rate(cpu_rows)
    draws, factors = pw["knockout"]["control_draws"], len(pw["experiments"]["pr_factors"])
    layer = n * d.hidden * 4  # one layer's states in float32
    out = []
    # probe_deltap: one layer of the clean, knockout and control states at once, and a training fold's copy
    # pathway_experiments: the awareness probes (L - 1 layers) and the layer-K fits, about 4 layers' worth
    for rule, layer_fits, arrays in (
        ("probe_deltap", d.layers, 3 + draws),
        ("pathway_experiments", d.layers + 3, 3 + 2 * factors + 1),
    ):
        seconds = Figure(
            rate * layer_fits * fits * n * d.hidden,
            measured and rule == "probe_deltap",
            f"{d.layers if rule == 'probe_deltap' else 'L + 3'} layers x {fits} fits x N x D at {where}",
        )
        ram = Figure((arrays * layer + 0.5 * GIB) / GIB, False, f"{arrays} float32 [N, D] arrays + 0.5 GiB")
        row = measured_rule(cpu_rows, rule)
        if row:
            scale = n * d.hidden * d.layers / (int(row["n"]) * int(row["hidden"]) * int(row["layers"]))
            text = f"cpu_cost.tsv x {scale:.2f} (N x D x L): {row['machine']}, {row['date']}"
            seconds = Figure(float(row["cpu_seconds"]) * scale, True, text)
            ram = Figure(
                float(row["peak_rss_mb"]) * 2**20 * scale / GIB,
                False,
                f"cpu_cost.tsv's peak RSS x {scale:.2f}",
            )
        out.append(Cost(model, dataset, rule, rule, cpu_seconds=seconds, ram_gib=ram))
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
        rows = read_tsv(THROUGHPUT) if rows is None else rows
        card = card or default_card(rows) or "no card"
        known = {s: d for s in SHAPE_HUB if (d := shape_dims(s))} | dict(shapes or {})
        return cls(card, figures(rows, card), read_ratios(), read_tsv(CPU_COST), known)


def gpu_costs(config: dict, name: str, part: str, datasets: list[str], setting: Setting) -> list[Cost]:
    """Every GPU stage of one model over its datasets."""
    spec = config["models"][name]
    d = diskplan.model_dims(name, spec)
    if d is None or not setting.measured:
        why = "its dimensions are unknown" if d is None else f"no throughput rows for {setting.card}"
        raise TruthflowError(f"cannot price model '{name}': {why}")
    shape, factor, scaled = basis(name, d, setting.measured, setting.shapes)
    rows, gpus, dtype = setting.measured[shape], max(1, int(spec["gpus"])), spec["dtype"]
    pw = config["pathways"]
    jobs = {"generation", "passes"} | ({"saliency"} if part == "pathways" else set())
    mem = plan_model(name, spec, d, jobs, pw["experiments"]["saliency_batch_size"])
    kind = {"answers": "generation", "saliency": "saliency"}
    ram = Figure(
        JOB_RAM_GIB + min(SHARD_BYTES, mem["weights"] * GIB) / GIB,
        False,
        "torch + CUDA libraries and one 5 GB weight shard",
    )
    ko = rows["knockout"]
    measured_draws = schema_defaults("pathways", "knockout")["control_draws"]
    scaled_text = ", scaled by active params (see 'scaled')" if scaled else ""
    out = []
    for dataset in datasets:
        n = diskplan.dataset_rows(config, dataset)
        for stage in PATHWAYS if part == "pathways" else DEPTH:
            if stage == "answers":
                new = config["depth"]["max_new_tokens"] if part == "depth" else spec["max_new_tokens"]
                prompt = PROMPT_TOKENS.get(dataset, 32) + (CHAT_TOKENS if spec["chat"] else 0)
                batch = decode_batch(spec["batch_size"], spec["token_budget"], prompt, new)
                fixed, per_byte = setting.step
                text = (
                    f"decode steps of {fixed * 1e3:.1f} ms + bytes read (weights, KV cache) at "
                    f"{1e-9 / per_byte:,.0f} GB/s, fitted on answers rows; the batch configured, {new} new"
                )
                per = Figure(answers_seconds(d, dtype, batch, prompt, new, setting.step), False, text)
            elif stage == "knockout":
                passes = (1 + pw["knockout"]["control_draws"]) / (1 + measured_draws)
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
            rule = "answer_depthqa" if (part, stage) == ("depth", "answers") else RULE[stage]
            gpu = Figure(per.value * n * gpus, per.measured, per.basis)
            out.append(
                Cost(
                    name,
                    dataset,
                    stage,
                    rule,
                    gpu_seconds=gpu,
                    gpu_mem_gib=mem[kind.get(stage, "passes")],
                    ram_gib=ram,
                    gpus=gpus,
                )
            )
    return out


def prepared(path: Path) -> dict:
    """A config file checked, its batch sizes fitted to memory and its defaults filled, as the Snakefile does
    (without the data, prompt and judge checks, which need the files and keys of a real run)."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise TruthflowError(f"cannot read config {path}: {exc}") from None
    keep = (raw.get("pathways") or {}).pop("keep_states", None)  # a key newer than some schemas
    fit_to_memory(raw, check_config(raw, [path]))
    config = fill_defaults(raw)
    config["pathways"]["keep_states"] = True if keep is None else bool(keep)
    return config


def price(config: dict, setting: Setting) -> list[Cost]:
    """Every cost line of a prepared config."""
    out = []
    pw_models, depth_models = config["pathways"]["models"], config["depth"]["models"]
    files = {(r.model, r.dataset): r for r in diskplan.run_files(config)}
    keep = bool(config["pathways"].get("keep_states", True))
    for name in dict.fromkeys([*pw_models, *depth_models]):
        weights = diskplan.weights_bytes(name, config["models"][name])
        out.append(Cost(name, "", "weights", "prepare_model", written=weights, held=weights))
    qa = defaultdict(list)
    for model, dataset in diskplan.qa_runs(config):
        qa[model].append(dataset)
    for name, datasets in qa.items():
        costs = gpu_costs(config, name, "pathways", datasets, setting)
        d = diskplan.model_dims(name, config["models"][name])
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
                out += cpu_costs(config, name, dataset, d, files[(name, dataset)].n, setting.cpu_rows)
    for name in depth_models:
        out += gpu_costs(config, name, "depth", [registry.DEPTHQA], setting)
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


def table_jobs(config: dict) -> int:
    """Table and plot jobs of a config: the aggregates, a figure job per pair, the HTML tables."""
    pairs = len(config["figures"]["pathways"]) if config["pathways"]["models"] else 0
    pathways = (2 + 2 * pairs) if config["pathways"]["models"] else 0
    depth = (2 if config["figures"]["depth"] else 1) if config["depth"]["models"] else 0
    return 1 + pathways + depth + 2 + 8  # accuracy, ..., compare_published and benchmark_table, HTML tables


def job_seconds(config: dict, setting: Setting | None = None) -> dict[tuple[str, str, str], float]:
    """Wall seconds of each job (rule, model, dataset) of a prepared config, from its bill; {} where the
    bill cannot price it (the disk plan then orders jobs with no durations)."""
    try:
        costs = price(config, setting or Setting.load())
    except TruthflowError:
        return {}
    out: dict = defaultdict(float)
    for c in costs:
        if c.gpu_seconds:
            out[(c.rule, c.model, c.dataset)] += c.gpu_seconds.value / c.gpus
        if c.cpu_seconds and c.rule in CPU_STAGES:
            out[(c.rule, c.model, c.dataset)] += c.cpu_seconds.value
    return dict(out)


def _cell(f: Figure | None, scale: float, legend: dict) -> str:
    if f is None:
        return f"{'':>13}"
    key = legend.setdefault(f.basis, len(legend) + 1)
    return f"{f.value / scale:9,.2f} {'m' if f.measured else 'e'}{key:<2}"


def _gb(b: int) -> str:
    return f"{b / 1e9:8,.1f}"


def print_bill(run: str, path: Path, config: dict, costs: list[Cost], setting: Setting, slots: int) -> dict:
    """The bill of one config; returns its totals."""
    legend: dict = {}
    merged: dict = {}
    for c in costs:
        key = (c.model, c.stage if c.rule != "answer_depthqa" else "answers (DepthQA)")
        if key in merged:
            m = merged[key]
            add = {
                k: (getattr(m, k) + getattr(c, k)) if getattr(m, k) else getattr(c, k)
                for k in ("gpu_seconds", "cpu_seconds", "written", "held")
            }
            merged[key] = Cost(**{**m.__dict__, **add})
        else:
            merged[key] = c
    print(f"\n{run} ({path}): GPU-hours on {setting.card}; m measured, e estimated, [k] basis below")
    head = f"  {'model':<26}{'stage':<20}{'GPU-h':>13}{'CPU-h':>13}{'written GB':>11}{'held GB':>9}"
    print(head + f"{'GPU GiB':>9}{'RAM GiB':>13}")
    for (model, stage), c in merged.items():
        mem = f"{c.gpu_mem_gib:9.1f}" if c.gpu_mem_gib is not None else f"{'':>9}"
        print(
            f"  {model:<26}{stage:<20}"
            f"{_cell(c.gpu_seconds, 3600, legend)}{_cell(c.cpu_seconds, 3600, legend)}"
            f"{_gb(c.written):>11}{_gb(c.held):>9}{mem}{_cell(c.ram_gib, 1, legend)}"
        )
    gpu = [c.gpu_seconds for c in costs if c.gpu_seconds]
    cpu = [c.cpu_seconds for c in costs if c.cpu_seconds]
    gpu_h, gpu_est = sum(f.value for f in gpu) / 3600, sum(f.value for f in gpu if not f.measured) / 3600
    cpu_h, cpu_est = sum(f.value for f in cpu) / 3600, sum(f.value for f in cpu if not f.measured) / 3600
    disk = diskplan.plan(config, slots, job_seconds(config, setting))
    print("  basis:")
    for text, key in legend.items():
        print(f"   [{key}] {text}")
    print(f"  measured rows ({THROUGHPUT.name}, {setting.card}):")
    for shape, stages in setting.measured.items():
        for stage, r in stages.items():
            print(
                f"   {shape} {stage}: {r['samples_per_s']:,.1f}/s, {r.get('settings', '')}; "
                f"{r.get('source', '')}"
            )
    scaled = []
    for name in dict.fromkeys(c.model for c in costs if c.gpu_seconds):
        shape, factor, estimated = basis(
            name, diskplan.model_dims(name, config["models"][name]), setting.measured, setting.shapes
        )
        scaled += [f"{name} = {shape} x {factor:.2f}"] if estimated else []
    if scaled:
        print(f"  scaled (time per sample x active params over the measured shape's): {'; '.join(scaled)}")
    print(
        f"  total {run}: {gpu_h:,.1f} GPU-hours on {setting.card} "
        f"({gpu_est:,.1f} of {gpu_h:,.1f} estimated), "
        f"{cpu_h:,.1f} CPU-hours ({cpu_est:,.1f} estimated)"
    )
    print(f"  disk {run}: {disk.line()}; simulated run {disk.hours:,.1f} h")
    if disk.unsized:
        print(f"  not sized (dimensions unknown until prepared): {', '.join(disk.unsized)}")
    return {"gpu": gpu_h, "gpu_est": gpu_est, "cpu": cpu_h, "cpu_est": cpu_est, "peak": disk.peak_bytes}


def report(paths: Iterable[Path], setting: Setting, slots: int = 1) -> None:
    """Print the bill of each config file and, for several, their sum; a bad config exits with one line."""
    if not setting.measured:
        sys.exit(f"no throughput figures for card {setting.card!r} in {THROUGHPUT}")
    totals = []
    for path in paths:
        try:
            config = prepared(path)
            totals.append(print_bill(config["run"], path, config, price(config, setting), setting, slots))
        except TruthflowError as exc:
            sys.exit(f"truthflow.bill: {path}: {exc}")
    if len(totals) > 1:
        gpu, est = sum(t["gpu"] for t in totals), sum(t["gpu_est"] for t in totals)
        cpu, peak = sum(t["cpu"] for t in totals), max(t["peak"] for t in totals)
        print(
            f"\nall configs: {gpu:,.1f} GPU-hours on {setting.card} ({est:,.1f} of {gpu:,.1f} estimated), "
            f"{cpu:,.1f} CPU-hours; the largest peak disk {peak / 1e9:,.0f} GB"
        )


def arguments(description: str = __doc__):
    ap = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("configs", nargs="*", type=Path, help="config files (default: both paper configs)")
    ap.add_argument("--card", help="the card whose figures to use (default: the one with most rows)")
    ap.add_argument(
        "--gpu-slots", type=int, default=1, help="GPU jobs at once, for the disk peak (default 1)"
    )
    return ap


def main(argv: Iterable[str] | None = None) -> None:
    args = arguments().parse_args(None if argv is None else list(argv))
    report(args.configs or PAPER_CONFIGS, Setting.load(args.card), args.gpu_slots)


if __name__ == "__main__":
    main()
