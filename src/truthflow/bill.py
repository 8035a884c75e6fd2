"""The bill of a run before it runs: per model and stage, GPU-hours on the card, CPU-hours of the analysis
jobs with the threads and memory their rules request, disk written and still held at the end, peak GPU
memory and RAM; each figure measured (where and when) or estimated (on what basis), and the totals with the
estimated part named; answers priced as vLLM generates them, with what the engine's would cost beside them.
The figures: `truthflow.pricing`; the disk: `truthflow.diskplan`.

    python -m truthflow.bill                                 # both paper configs
    python -m truthflow.bill config.yaml --gpu-slots 2       # any config
    python -m truthflow.bill config.yaml --benchmarks results/demo/tables/benchmarks.tsv
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

from . import diskplan, judge_cost
from .cost_lines import Cost, Figure
from .errors import TruthflowError
from .pricing import (
    CPU_STAGES,
    PAPER_CONFIGS,
    THROUGHPUT,
    FinishedRun,
    Setting,
    basis,
    durations,
    prepared,
    price,
    runs_on_cpu,
)


def _cell(f: Figure | None, scale: float, legend: dict) -> str:
    if f is None:
        return f"{'':>13}"
    key = legend.setdefault(f.basis, len(legend) + 1)
    return f"{f.value / scale:9,.2f} {'m' if f.measured else 'e'}{key:<2}"


def _gb(b: int) -> str:
    return f"{b / 1e9:8,.1f}"


def merged(costs: list[Cost]) -> dict[tuple[str, str], Cost]:
    """One line per (model, stage) over its datasets: times and disk summed, the largest request kept."""
    out: dict = {}
    for c in costs:
        key = (
            c.model,
            "answers (DepthQA)" if (c.rule, c.stage) == ("answer_depthqa", "answers") else c.stage,
        )
        if key not in out:
            out[key] = c
            continue
        m = out[key]
        add = {
            k: (getattr(m, k) + getattr(c, k)) if getattr(m, k) else getattr(c, k)
            for k in ("gpu_seconds", "cpu_seconds", "written", "held", "engine_seconds")
        }
        ram = max((f for f in (m.ram_gib, c.ram_gib) if f), key=lambda f: f.value, default=None)
        out[key] = Cost(**{**m.__dict__, **add, "ram_gib": ram, "threads": max(m.threads, c.threads)})
    return out


def print_bill(
    run: str,
    path: Path,
    config: dict,
    costs: list[Cost],
    setting: Setting,
    slots: int,
    finished: FinishedRun | None = None,
) -> dict:
    """The bill of one config (`finished`: the run whose figures it took); returns its totals."""
    legend: dict = {}
    print(f"\n{run} ({path}): GPU-hours on {setting.card}; m measured, e estimated, [k] basis below")
    on_cpu = [
        m for m in dict.fromkeys(c.model for c in costs if c.gpu_seconds) if runs_on_cpu(config["models"][m])
    ]
    if on_cpu:
        print(
            f"  no measurement on a CPU: the model jobs of {', '.join(on_cpu)} run on the CPU (float32 or "
            f"gpus 0) and are priced on {setting.card}'s figures, a GPU's time, not a CPU's"
        )
    head = f"  {'model':<26}{'stage':<20}{'GPU-h':>13}{'CPU-h':>13}{'thr':>4}{'written GB':>11}{'held GB':>9}"
    print(head + f"{'GPU GiB':>9}{'RAM GiB':>13}")
    for (model, stage), c in merged(costs).items():
        mem = f"{c.gpu_mem_gib:9.1f}" if c.gpu_mem_gib is not None else f"{'':>9}"
        threads = f"{c.threads:>4}" if c.cpu_seconds and c.rule != "tables" else f"{'':>4}"
        print(
            f"  {model:<26}{stage:<20}"
            f"{_cell(c.gpu_seconds, 3600, legend)}{_cell(c.cpu_seconds, 3600, legend)}{threads}"
            f"{_gb(c.written):>11}{_gb(c.held):>9}{mem}{_cell(c.ram_gib, 1, legend)}"
        )
    gpu = [c.gpu_seconds for c in costs if c.gpu_seconds]
    cpu = [c.cpu_seconds for c in costs if c.cpu_seconds]
    gpu_h, gpu_est = sum(f.value for f in gpu) / 3600, sum(f.value for f in gpu if not f.measured) / 3600
    cpu_h, cpu_est = sum(f.value for f in cpu) / 3600, sum(f.value for f in cpu if not f.measured) / 3600
    disk = diskplan.plan(config, slots, durations(costs))
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
    engine_h = gpu_h
    if compared := engine_lines(costs):
        print(compared)
        engine_h += (
            sum(c.engine_seconds.value - c.gpu_seconds.value for c in costs if c.engine_seconds) / 3600
        )
    if finished:
        print(finished_line(finished, costs))
    print(
        f"  total {run}: {gpu_h:,.1f} GPU-hours on {setting.card} "
        f"({gpu_est:,.1f} of {gpu_h:,.1f} estimated), "
        f"{cpu_h:,.1f} CPU-hours ({cpu_est:,.1f} estimated)"
        + (f"; with the engine's answers {engine_h:,.1f} GPU-hours" if compared else "")
    )
    pace = f" (model jobs at {setting.card}'s pace)" if on_cpu else ""
    print(
        f"  disk {run}: {disk.line()}; simulated run {disk.hours:,.1f} h{pace}, analysis jobs at CPU-seconds "
        "over their threads"
    )
    if disk.unsized:
        print(f"  not sized (dimensions unknown until prepared): {', '.join(disk.unsized)}")
    judge = judge_cost.judge_bill(config)
    if judge:
        print(judge_cost.line(judge, setting.card, costs))
    usd = (judge.dollars() or 0.0) if judge else 0.0
    return {
        "gpu": gpu_h,
        "gpu_est": gpu_est,
        "engine": engine_h,
        "cpu": cpu_h,
        "cpu_est": cpu_est,
        "peak": disk.peak_bytes,
        "together": (config, disk),
        "usd": usd,
    }


def engine_lines(costs: list[Cost]) -> str:
    """The lines priced as vLLM generates them beside what the engine's answers would cost ('' for none): per
    model and stage, and the engine's basis."""
    lines = [(key, c) for key, c in merged(costs).items() if c.engine_seconds]
    if not lines:
        return ""
    bases = dict.fromkeys(b for _, c in lines for b in c.engine_seconds.basis.split("; ") if "fitted" in b)
    out = [f"  the same answers on the engine (estimated: {'; '.join(bases)}), GPU-hours:"]
    for (model, stage), c in lines:
        vllm, engine = c.gpu_seconds.value / 3600, c.engine_seconds.value / 3600
        out.append(f"   {model} {stage}: vLLM {vllm:,.2f}, engine {engine:,.2f}")
    vllm = sum(c.gpu_seconds.value for _, c in lines) / 3600
    engine = sum(c.engine_seconds.value for _, c in lines) / 3600
    out.append(f"   in all: vLLM {vllm:,.1f}, engine {engine:,.1f} ({engine / vllm:,.1f}x)")
    return "\n".join(out)


def finished_line(finished: FinishedRun, costs: list[Cost]) -> str:
    """Which analysis jobs the bill took from a finished run, and which of them it left (another shape)."""
    jobs = {(c.rule, c.model, c.dataset): c.cpu_seconds for c in costs if c.rule in CPU_STAGES}
    taken = [job for job, figure in jobs.items() if figure.basis == finished.basis]
    left = [job for job in jobs if job in finished.rows and job not in taken]
    line = f"  from the finished run ({finished.path}), measured: {_jobs(taken)}"
    return line + (f"; its rows of another shape, not used: {_jobs(left)}" if left else "")


def _jobs(jobs: list[tuple[str, str, str]]) -> str:
    """(rule, model, dataset) keys as "rule model/dataset", sorted; "none" for none."""
    return ", ".join(f"{r} {m}/{d}" for r, m, d in sorted(jobs)) or "none"


def finished_run(config: dict, benchmarks: Path | None) -> FinishedRun | None:
    """The run's benchmark table: `benchmarks`, else results/<run>/tables/benchmarks.tsv where it exists (in
    the working directory, where Snakemake writes it)."""
    path = benchmarks or Path("results", config["run"], "tables", "benchmarks.tsv")
    return FinishedRun.load(path, config["run"]) if path.is_file() else None


def report(paths: Iterable[Path], setting: Setting, slots: int = 1, benchmarks: Path | None = None) -> None:
    """Print the bill of each config file and, for several, their sum; a bad config exits with one line.
    benchmarks: a finished run's benchmark table (default: each config's run's, where it exists)."""
    if not setting.measured:
        sys.exit(f"no throughput figures for card {setting.card!r} in {THROUGHPUT}")
    totals = []
    for path in paths:
        try:
            config = prepared(path)
            finished = finished_run(config, benchmarks)
            costs = price(config, setting, finished)
            totals.append(print_bill(config["run"], path, config, costs, setting, slots, finished))
        except TruthflowError as exc:
            sys.exit(f"truthflow.bill: {path}: {exc}")
    if len(totals) > 1:
        gpu, est = sum(t["gpu"] for t in totals), sum(t["gpu_est"] for t in totals)
        cpu, peak = sum(t["cpu"] for t in totals), max(t["peak"] for t in totals)
        print(
            f"\nall configs: {gpu:,.1f} GPU-hours on {setting.card} ({est:,.1f} of {gpu:,.1f} estimated), "
            f"{cpu:,.1f} CPU-hours; the largest peak disk {peak / 1e9:,.0f} GB; judge calls "
            f"${sum(t['usd'] for t in totals):,.0f} (estimated)"
        )
        both = diskplan.together([t["together"] for t in totals])
        print(
            f"in one checkout, one after another: {both['held'] / 1e9:,.0f} GB held at the end (every run's "
            f"weights, a model name they share once, and final files), a peak of {both['peak'] / 1e9:,.0f} GB"
        )


def arguments(description: str = __doc__) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("configs", nargs="*", type=Path, help="config files (default: both paper configs)")
    ap.add_argument("--card", help="the card whose figures to use (default: the one with most rows)")
    ap.add_argument(
        "--gpu-slots", type=int, default=1, help="GPU jobs at once, for the disk peak (default 1)"
    )
    ap.add_argument(
        "--benchmarks",
        type=Path,
        help="a finished run's benchmark table: its analysis jobs at the shape priced replace the "
        "estimates (default: results/<run>/tables/benchmarks.tsv where it exists)",
    )
    return ap


def main(argv: Iterable[str] | None = None) -> None:
    args = arguments().parse_args(None if argv is None else list(argv))
    report(args.configs or PAPER_CONFIGS, Setting.load(args.card), args.gpu_slots, args.benchmarks)


if __name__ == "__main__":
    main()
