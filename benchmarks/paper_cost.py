"""What the papers cost before anyone pays: GPU-hours per model, per stage and in total for the paper configs,
from measured per-stage throughput and each dataset's real row count.

    python benchmarks/paper_cost.py                       # the figures of throughput.tsv (--card to pick)
    python benchmarks/paper_cost.py --measure tiny --n 8  # measure the tiny shape here first (CPU: seconds)

Throughput: benchmarks/throughput.tsv (bench_job.py --record appends to it), samples/s per shape, stage and
card. A model whose shape was measured on the card uses its figures; any other is scaled from the measured
shape nearest in parameter count (time per sample in proportion to the parameters a token runs through) and
flagged as an estimate. A model on g GPUs costs g GPU-hours per hour. Rows: every row of a dataset whose n is
null (else n); every answered question is assumed kept for the later stages (an upper bound: the exact-token
step drops some). DepthQA answers decode up to depth.max_new_tokens: the answers figure is scaled from the
tokens it was measured at. The knockout runs one pass per condition (E_Q and each control draw; the clean
states come off saliency): its figure, measured with the schema's control draws (bench_job), is scaled to the
config's pathways.knockout.control_draws. A stage without a figure on the card is pending and left out of the
totals (named).
Not counted: the judge (an API), the probes and tables (CPU).
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import yaml  # noqa: E402
from common import REPO  # noqa: E402
from shapes import SHAPES, dims  # noqa: E402

from truthflow.config import fill_defaults, schema_defaults  # noqa: E402
from truthflow.memplan import dims_for  # noqa: E402

TABLE = Path(__file__).resolve().parent / "throughput.tsv"
CONFIGS = [REPO / "configs" / "paper-pathways.yaml", REPO / "configs" / "paper-depth.yaml"]
ROWS = {"popqa": 14_267, "triviaqa": 17_944, "hotpotqa": 7_405, "nq": 3_610, "depthqa": 1_571}
PATHWAYS = ("answers", "saliency", "knockout", "patching", "answer-only", "reweighting", "P(True)")
DEPTH = ("MIN-K%", "answers")


def read_table(path: Path) -> list[dict]:
    lines = [line.split("\t") for line in path.read_text().splitlines() if line.strip()]
    rows = [dict(zip(lines[0], line, strict=True)) for line in lines[1:]]
    for r in rows:
        r["samples_per_s"], r["max_new_tokens"] = float(r["samples_per_s"]), int(r["max_new_tokens"])
    return rows


def figures(rows: list[dict], card: str) -> dict[str, dict[str, dict]]:
    """{shape: {stage: row}} on the card; the last row of a (shape, stage) wins (the newest measurement)."""
    out: dict = defaultdict(dict)
    for r in rows:
        if r["card"] == card:
            out[r["shape"]][r["stage"]] = r
    return dict(out)


def active_params(d) -> int:
    """Parameters a token passes through: a mixture of experts runs experts_per_token of its experts."""
    return d.params - d.layers * (d.experts - d.experts_per_token) * 3 * d.hidden * d.intermediate


def basis(name: str, params: int, measured: dict) -> tuple[str, float, bool]:
    """(measured shape, factor on its time per sample, estimate?) of a model."""
    if name in measured:
        return name, 1.0, False
    shape = min(measured, key=lambda s: abs(math.log(params / active_params(dims(s)))))
    return shape, params / active_params(dims(shape)), True


def stage_hours(
    n: int,
    stage: str,
    shape_rows: dict,
    factor: float,
    gpus: int,
    new_tokens: int | None,
    passes: float = 1.0,
):
    """GPU-hours of one stage over n samples, or None where the stage was not measured. passes: the stage's
    passes per sample relative to those it was measured with."""
    row = shape_rows.get(stage)
    if row is None:
        return None
    per_sample = factor * passes / row["samples_per_s"]
    if new_tokens is not None:  # decoding time grows with the new tokens
        per_sample *= new_tokens / row["max_new_tokens"]
    return n * per_sample * gpus / 3600


def knockout_passes(config: dict) -> float:
    """The config's knockout conditions (E_Q + control draws) over those of the measurement (the schema's)."""
    measured = schema_defaults("pathways", "knockout")["control_draws"]
    return (1 + config["pathways"]["knockout"]["control_draws"]) / (1 + measured)


def config_costs(path: Path, measured: dict) -> tuple[str, list[dict]]:
    """(run name, one cost row per model: stage -> GPU-hours or None, and how the figure was got)."""
    config = fill_defaults(copy.deepcopy(yaml.safe_load(path.read_text())))
    out = []
    jobs = [("pathways", m, PATHWAYS) for m in config["pathways"]["models"]]
    jobs += [("depth", m, DEPTH) for m in config["depth"]["models"]]
    for part, name, stages in jobs:
        spec = config["models"][name]
        params = active_params(dims_for(name, spec["source"])[0])
        shape, factor, estimate = basis(name, params, measured)
        hours: dict = {}
        datasets = config["pathways"]["datasets"] if part == "pathways" else ["depthqa"]
        for dataset in datasets:
            n = config["datasets"][dataset].get("n") or ROWS[dataset]
            n = min(n, ROWS[dataset])
            for stage in stages:
                new = config["depth"]["max_new_tokens"] if (part, stage) == ("depth", "answers") else None
                new = new or (spec["max_new_tokens"] if stage == "answers" else None)
                passes = knockout_passes(config) if stage == "knockout" else 1.0
                h = stage_hours(n, stage, measured[shape], factor, spec["gpus"], new, passes)
                hours[stage] = None if h is None or hours.get(stage, 0) is None else hours.get(stage, 0) + h
        how = f"estimate: {shape} x {factor:.2f} (params)" if estimate else f"measured: {shape}"
        out.append({"model": name, "gpus": spec["gpus"], "hours": hours, "how": how, "stages": stages})
    return config["run"], out


def print_costs(run: str, costs: list[dict]) -> float:
    stages = costs[0]["stages"] if costs else ()
    print(f"\n{run}: GPU-hours")
    print(f"  {'model':<26}{'gpus':>5}" + "".join(f"{s:>12}" for s in stages) + f"{'total':>10}  basis")
    grand, pending = 0.0, set()
    for c in costs:
        cells = [c["hours"][s] for s in stages]
        total = sum(h for h in cells if h is not None)
        pending |= {s for s, h in zip(stages, cells, strict=True) if h is None}
        grand += total
        text = "".join(f"{'pending':>12}" if h is None else f"{h:12,.2f}" for h in cells)
        print(f"  {c['model']:<26}{c['gpus']:>5}{text}{total:10,.1f}  {c['how']}")
    note = f" (pending stages left out: {', '.join(sorted(pending))})" if pending else ""
    print(f"  total {run}: {grand:,.1f} GPU-hours{note}")
    return grand


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", default=str(TABLE), help="throughput table (TSV)")
    ap.add_argument("--card", help="the card whose figures to use (default: the one with most rows)")
    ap.add_argument("--measure", choices=sorted(SHAPES), help="measure this shape here first (bench_job)")
    ap.add_argument("--n", type=int, default=16, help="--measure: questions of the measured job")
    ap.add_argument("--dtype", default=None, help="--measure: weights' dtype (default: float32 on a CPU)")
    args = ap.parse_args()
    rows = read_table(Path(args.table)) if Path(args.table).exists() else []
    if args.measure:
        import torch
        from bench_job import card_name, measure, model_default

        dtype = args.dtype or ("bfloat16" if torch.cuda.is_available() else "float32")
        new = model_default("max_new_tokens")
        got = measure(args.measure, args.n, dtype, None, new, 8)
        args.card = card_name()
        source = f"measured in this process, n {args.n}, {dtype}"
        rows = [r for r in rows if r["card"] != args.card] + [
            {"shape": args.measure, "card": args.card, "stage": s, "samples_per_s": args.n / t,
             "max_new_tokens": new, "source": source}
            for s, t in got["seconds"].items()
        ]  # fmt: skip
    cards: dict = defaultdict(int)
    for r in rows:
        cards[r["card"]] += 1
    if not cards:
        sys.exit(f"no throughput figures in {args.table}: run bench_job.py --record, or --measure")
    card = args.card or max(cards, key=cards.get)
    measured = figures(rows, card)
    if not measured:
        sys.exit(f"no figures for card {card!r} (cards: {', '.join(cards)})")
    print(f"GPU-hours of the paper configs from the throughput measured on {card}:")
    for shape, stages in measured.items():
        sources = "; ".join(sorted({r.get("source", "") for r in stages.values()}))
        rates = ", ".join(f"{s} {r['samples_per_s']:,.1f}/s" for s, r in stages.items())
        print(f"  {shape}: {rates} ({sources})")
    total = sum(print_costs(*config_costs(path, measured)) for path in CONFIGS)
    print(f"\nall paper configs: {total:,.1f} GPU-hours on {card} (estimates and pending stages as flagged)")


if __name__ == "__main__":
    main()
