import logging
from pathlib import Path

from truthflow import plotting, report_tables, runlog, validate
from truthflow.pathways import plots_experiments as pe

ROWS = ["model", "dataset", "experiment", "condition", "group", "layer", "n", "value", "ci_low", "ci_high"]
AWARENESS = ["model", "dataset", "layer", "seed", "auc", "status"]
SAMPLES = ["model", "dataset", "id", "group"]


def _read(path, columns):
    """An empty table (a run without rows writes it without columns) is passed on: the figures say so."""
    df = validate.read_parquet(path)
    if df.height:
        validate.check_columns(df, path, columns)
    return df


def main(sm):
    # runlog logs at INFO; fontTools would write hundreds of lines per PDF (font subsetting) into the log
    logging.getLogger("fontTools").setLevel(logging.WARNING)
    rows, awareness = _read(sm.input.rows, ROWS), _read(sm.input.awareness, AWARENESS)
    per_sample = _read(sm.input.per_sample, SAMPLES)
    published = validate.read_tsv(sm.input.published, ["kind", "model", "dataset", "anchor", "published"])
    models, titles = list(sm.params.models), dict(sm.params.titles)
    ks = pe.experiment_layers(rows, awareness)
    per_model = {m: plotting.ordered(d for n, d in ks if n == m) for m in models}
    k = "; ".join(
        ", ".join(f"{ks[(m, ds)]} ({plotting.label(ds)})" for ds in mine) + f" for {titles.get(m, m)}"
        for m, mine in per_model.items()
        if mine
    )

    def caption(fig: str) -> str:
        at_k = f"Experiment layer K: {k or 'none in the tables'}."
        return (
            report_tables.caption(Path(sm.params.report, f"pathways_{fig}.rst"), extra=at_k)
            if sm.params.show_caption
            else ""
        )

    def out(fig: str):
        return sm.output[f"{fig}_png"], sm.output[f"{fig}_pdf"], caption(fig)

    pe.plot_patching(rows, models, titles, *out("patching"), published=published)
    pe.plot_answer_only(rows, models, titles, *out("answer_only"), published=published)
    pe.plot_boundary(rows, per_sample, models, titles, *out("boundary"))
    pe.plot_saliency(per_sample, models, titles, *out("saliency"))
    pe.plot_awareness(awareness, rows, models, titles, *out("awareness"))


runlog.run(snakemake, main)  # noqa: F821
