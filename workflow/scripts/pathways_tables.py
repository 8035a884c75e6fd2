import polars as pl

from truthflow import runlog, validate
from truthflow.pathways.check import family
from truthflow.pathways.tokens import CLASS_TABLE_SCHEMA, class_table


def _concat(paths, columns) -> pl.DataFrame:
    return pl.concat([validate.read_parquet(p, columns) for p in paths], how="diagonal_relaxed")


def exact_token_table(pairs, sample_paths) -> pl.DataFrame:
    frames = []
    for (model, dataset), path in zip(pairs, sample_paths, strict=True):
        s = validate.read_parquet(path, ["id", "correct"])
        if s.height and "n_ea" in s.columns:
            frames.append(class_table(s, model, dataset))
    if not frames:
        return pl.DataFrame(schema=CLASS_TABLE_SCHEMA)
    return pl.concat(frames).sort(["model", "dataset", "class"])


def main(sm):
    summary = _concat(sm.input.summary, ["model", "dataset", "knockout", "anchor", "layer", "mean_delta_p"])
    auc = _concat(sm.input.auc, ["model", "dataset", "layer", "status", "auc", "seed", "n_test"])
    dropped = _concat(sm.input.dropped, ["model", "dataset", "reason"])
    cells = _concat(sm.input.check, ["model", "dataset", "range", "measure", "n_samples", "diff", "sd"])
    check, by_layers = family(cells, sm.params.check)  # the verdicts: Holm needs every cell
    # one row per (model, dataset, reason), with the kept count as reason "kept" so nothing is silent
    kept = pl.DataFrame(
        [
            {
                "model": m,
                "dataset": d,
                "reason": "kept",
                "n": validate.count_rows(p, ["id", "correct"]),
            }
            for (m, d), p in zip(sm.params.pairs, sm.input.samples, strict=True)
        ],
        schema={"model": pl.String, "dataset": pl.String, "reason": pl.String, "n": pl.UInt32},
    )
    # drops at loading (repeated ids, no gold answer, n above the usable rows) hold for every model
    data_dropped = (
        _concat(sm.input.data_dropped, ["dataset", "reason", "detail"]) if sm.input.data_dropped else None
    )
    data_rows = (
        data_dropped.group_by(["dataset", "reason"])
        .agg(pl.len().alias("n"), pl.col("detail").drop_nulls().first())
        .with_columns(pl.lit("(loading, all models)").alias("model"))
        if data_dropped is not None and data_dropped.height
        else None
    )
    table = pl.concat(
        [
            kept.with_columns(pl.lit(None, dtype=pl.String).alias("detail")),
            dropped.group_by(["model", "dataset", "reason"])
            .len("n")
            .with_columns(pl.lit(None, dtype=pl.String).alias("detail")),
            *([data_rows] if data_rows is not None else []),
        ],
        how="diagonal_relaxed",
    ).select("model", "dataset", "reason", "n", "detail")
    runlog.write_parquet(summary, sm.output.summary)
    runlog.write_parquet(auc, sm.output.auc)
    runlog.write_parquet(check, sm.output.check)
    by_layer = (
        auc.group_by(["model", "dataset", "layer", "status"], maintain_order=True)
        .agg(
            pl.col("auc").mean().round(3).alias("mean_auc"),
            pl.col("auc").min().round(3).alias("min_auc"),
            pl.col("auc").max().round(3).alias("max_auc"),
            pl.col("seed").n_unique().alias("n_seeds"),
            pl.col("n_test").first(),
        )
        .sort(["model", "dataset", "layer"], nulls_last=True)
    )
    runlog.write_tsv(by_layer, sm.output.auc_tsv)
    runlog.write_tsv(table.sort(["model", "dataset", "reason"]), sm.output.dropped)
    p = pl.selectors.by_name("p_value", "p_holm", "level", "secondary_p", require_all=False)
    for table, path in ((check, sm.output.check_tsv), (by_layers, sm.output.check_layers)):
        rounded = table.with_columns((pl.selectors.float() - p).round(2), p.round_sig_figs(3))
        runlog.write_tsv(rounded, path)
    runlog.write_tsv(exact_token_table(sm.params.pairs, sm.input.samples), sm.output.exact_tokens)
    for r in check.iter_rows(named=True):
        print(f"{r['model']}/{r['dataset']}: {r['verdict']} ({r['reason']})", flush=True)


runlog.run(snakemake, main)  # noqa: F821
