import polars as pl

from truthflow import registry, runlog, validate
from truthflow.pathways.detection import detection_summary


def _concat(paths, columns) -> pl.DataFrame:
    frames = [validate.read_parquet(p, columns) for p in paths]
    filled = [f for f in frames if f.height]
    # no rows anywhere (every pair undefined): an empty table that keeps its columns
    return pl.concat(filled, how="diagonal_relaxed") if filled else frames[0]


def _display(ds: str) -> str:
    return registry.get(ds).display if registry.is_qa(ds) else ds


def table3(detection: pl.DataFrame) -> pl.DataFrame:
    """The paper's Table 3 layout: one row per (model, method), one column per dataset, 'mean ± sd' of the
    test AUC (%) over the probe seeds; '–' where undefined."""
    if detection.height == 0:
        return pl.DataFrame(schema={"model": pl.String, "method": pl.String})
    datasets = [d for d in registry.qa_names() if d in set(detection["dataset"])]
    datasets += sorted(set(detection["dataset"]) - set(datasets))
    methods = detection["method"].unique(maintain_order=True).to_list()
    rows = []
    for model in detection["model"].unique(maintain_order=True).to_list():
        cells: dict[tuple[str, str], str] = {}
        for ds in datasets:
            part = detection.filter((pl.col("model") == model) & (pl.col("dataset") == ds))
            if part.height == 0:
                continue
            for r in detection_summary(part).iter_rows(named=True):
                if r["mean"] is None:
                    cells[(r["method"], ds)] = "–"
                    continue
                sd = "" if r["sd"] is None else f" ± {100 * r['sd']:.2f}"
                cells[(r["method"], ds)] = f"{100 * r['mean']:.2f}{sd}"
        for m in methods:
            rows.append(
                {"model": model, "method": m, **{_display(ds): cells.get((m, ds), "–") for ds in datasets}}
            )
    return pl.DataFrame(rows)


def main(sm):
    rows = _concat(sm.input.rows, ["model", "dataset", "experiment", "group", "value"])
    aware = _concat(sm.input.awareness, ["model", "dataset", "layer", "auc"])
    det = _concat(sm.input.detection, ["model", "dataset", "method", "seed", "auc", "status"])
    per_sample = _concat(sm.input.per_sample, ["model", "dataset", "id", "group"])
    runlog.write_parquet(rows, sm.output.rows)
    runlog.write_tsv(rows, sm.output.rows_tsv)
    runlog.write_parquet(aware, sm.output.awareness)
    summary = (
        aware.filter(pl.col("auc").is_not_null())
        .group_by(["model", "dataset", "layer"])
        .agg(
            pl.col("auc").mean().alias("mean_auc"),
            pl.col("auc").std().alias("sd_auc"),
            pl.len().alias("n_seeds"),
        )
        .sort(["model", "dataset", "layer"])
        if aware.height
        else aware
    )
    runlog.write_tsv(summary, sm.output.awareness_tsv)
    runlog.write_parquet(det, sm.output.detection)
    t3 = table3(det)
    runlog.write_tsv(t3, sm.output.table3)
    runlog.write_parquet(per_sample, sm.output.per_sample)
    if t3.height:
        print(t3, flush=True)


runlog.run(snakemake, main)  # noqa: F821
