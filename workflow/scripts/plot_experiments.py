import logging

from truthflow import report_tables, runlog, validate
from truthflow.pathways import plots_experiments


def _read(path, columns):
    """An empty table (a run without rows writes it without columns) is passed on: the figures say so."""
    df = validate.read_parquet(path)
    if df.height:
        validate.check_columns(df, path, columns)
    return df


def main(sm):
    # runlog logs at INFO; fontTools would write hundreds of lines per PDF (font subsetting) into the log
    logging.getLogger("fontTools").setLevel(logging.WARNING)
    rows, awareness, per_sample = (
        _read(getattr(sm.input, t), cols) for t, cols in plots_experiments.REQUIRED.items()
    )
    published = validate.read_tsv(sm.input.published, list(plots_experiments.PUBLISHED_SCHEMA))
    models, titles = list(sm.params.models), dict(sm.params.titles)
    at_k = plots_experiments.k_caption(rows, awareness, models, titles)

    def out(fig: str):
        name = f"experiment_{fig}"
        cap = report_tables.caption(sm.input[f"{name}_caption"], extra=at_k) if sm.params.show_caption else ""
        return sm.output[f"{name}_png"], sm.output[f"{name}_pdf"], cap

    plots_experiments.plot_patching(rows, models, titles, *out("patching"), published=published)
    plots_experiments.plot_answer_only(rows, models, titles, *out("answer_only"), published=published)
    plots_experiments.plot_boundary(rows, per_sample, models, titles, *out("boundary"))
    plots_experiments.plot_saliency(per_sample, models, titles, *out("saliency"))
    plots_experiments.plot_awareness(awareness, rows, models, titles, *out("awareness"))


runlog.run(snakemake, main)  # noqa: F821
