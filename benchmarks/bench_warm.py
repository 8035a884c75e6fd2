"""Warm mode: the model jobs of one dataset rerun as the workflow runs them, forked from the warm process
(`truthflow.warm`, the default of a local CPU run) and, as the plain reference, one fresh process per job
(TRUTHFLOW_WARM=0), in the same run.

    python benchmarks/bench_warm.py --workdir /path/to/checkout  # after the demo ran there (README command 1)

Each mode is one `snakemake --cores 8 --forcerun` of the model jobs of --dataset, both models (answers,
knockouts, experiments): every job a new process meeting its shapes for the first time, as in the demo. The
modes alternate for --rounds rounds, so a drift of the machine's speed reaches both. Printed per mode: the
command's wall seconds (snakemake's own start and the warm process's imports included) and the jobs' own
seconds and CPU seconds, summed from the benchmark files each job writes as it ends (a forked job counts from
its fork: its imports and model load are the warm process's, which the wall seconds hold).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import yaml

RULES = ["generate_answers", "extract_pathways", "extract_experiments"]


def run(workdir: Path, dataset: str, warm: bool) -> tuple[float, float, float]:
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    run_dir = Path("results", config["run"])
    models = config["pathways"]["models"]
    targets = [str(run_dir / "benchmarks" / rule / m / f"{dataset}.tsv") for rule in RULES for m in models]
    env = {**os.environ, "TRUTHFLOW_WARM": "1" if warm else "0"}
    cmd = ["snakemake", "--cores", "8", "--forcerun", *RULES, "--", *targets]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"snakemake failed:\n{proc.stderr[-3000:]}")
    table = pl.concat([pl.read_csv(workdir / t, separator="\t", null_values="NA") for t in targets])
    return wall, float(table["seconds"].sum()), float(table["cpu_seconds"].sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--dataset", default="nq")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    seen = {True: [], False: []}
    for _ in range(args.rounds):
        for warm in (True, False):
            seen[warm].append(run(args.workdir, args.dataset, warm))
    print(f"the model jobs of {args.dataset} ({', '.join(RULES)}, every model), {args.rounds} round(s):")
    for warm, label in ((True, "warm process (default)"), (False, "a process per job (TRUTHFLOW_WARM=0)")):
        wall, seconds, cpu = (sum(x) / len(x) for x in zip(*seen[warm], strict=True))
        rounds = " / ".join(f"{r[0]:.1f}" for r in seen[warm])  # each round starts every process afresh
        print(f"  {label:38s} wall {wall:6.1f} s (rounds: {rounds}); jobs {seconds:6.1f} s, {cpu:6.1f} CPU-s")
    ratio = sum(r[0] for r in seen[True]) / sum(r[0] for r in seen[False])
    print(f"  ratio warm/plain, wall: {ratio:.2f}")


if __name__ == "__main__":
    main()
