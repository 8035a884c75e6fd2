import numpy as np
import polars as pl

from truthflow import runlog
from truthflow.probes import run_probes, summarize


def main(sm):
    samples = pl.read_parquet(sm.input.samples)
    clean = np.load(sm.input.resid_clean, mmap_mode="r")  # layer slices are read as needed
    ko = np.load(sm.input.resid_ko, mmap_mode="r")
    cfg = sm.params.cfg
    labels = samples["correct"].to_numpy().astype(int) if samples.height else np.zeros(0, dtype=int)
    auc, per_sample = run_probes(
        clean,
        ko,
        labels,
        samples["id"].to_list(),
        cfg["probe"]["seeds"],
        cfg["probe"]["test_size"],
        cfg["probe"]["C"],
        cfg["probe"]["max_iter"],
        cfg["anchor_split"],
        cfg["fixed_layer"],
    )
    summary = summarize(per_sample, cfg["bootstrap"]["n"], cfg["bootstrap"]["seed"])
    keys = [pl.lit(sm.wildcards.model).alias("model"), pl.lit(sm.wildcards.dataset).alias("dataset")]
    print(auc.group_by("status").len(), flush=True)
    runlog.write_parquet(auc.with_columns(keys).select("model", "dataset", *auc.columns), sm.output.auc)
    runlog.write_parquet(per_sample.with_columns(keys), sm.output.deltap)
    runlog.write_parquet(
        summary.with_columns(keys).select("model", "dataset", *summary.columns), sm.output.summary
    )


runlog.run(snakemake, main)  # noqa: F821
