import polars as pl

from truthflow import runlog


def main(sm):
    summary = pl.concat([pl.read_parquet(p) for p in sm.input.summary], how="diagonal_relaxed")
    auc = pl.concat([pl.read_parquet(p) for p in sm.input.auc], how="diagonal_relaxed")
    dropped = pl.concat([pl.read_parquet(p) for p in sm.input.dropped], how="diagonal_relaxed")
    # one row per (model, dataset, reason), with the kept count as reason "kept" so nothing is silent
    kept = pl.DataFrame(
        [
            {
                "model": m,
                "dataset": d,
                "reason": "kept",
                "n": pl.scan_parquet(p).select(pl.len()).collect().item(),
            }
            for (m, d), p in zip(sm.params.pairs, sm.input.samples, strict=True)
        ],
        schema={"model": pl.String, "dataset": pl.String, "reason": pl.String, "n": pl.UInt32},
    )
    table = pl.concat([kept, dropped.group_by(["model", "dataset", "reason"]).len("n").select(kept.columns)])
    runlog.write_parquet(summary, sm.output.summary)
    runlog.write_parquet(auc, sm.output.auc)
    by_layer = (
        auc.group_by(["model", "dataset", "layer", "status"], maintain_order=True)
        .agg(
            pl.col("auc").mean().alias("mean_auc"),
            pl.col("auc").min().alias("min_auc"),
            pl.col("auc").max().alias("max_auc"),
            pl.col("seed").n_unique().alias("n_seeds"),
            pl.col("n_test").first(),
        )
        .sort(["model", "dataset", "layer"], nulls_last=True)
    )
    runlog.write_tsv(by_layer, sm.output.auc_tsv)
    runlog.write_tsv(table.sort(["model", "dataset", "reason"]), sm.output.dropped)


runlog.run(snakemake, main)  # noqa: F821
