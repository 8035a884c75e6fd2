import polars as pl

from truthflow import runlog
from truthflow.plots_pathways import plot_pathways, plot_probe_auc


def main(sm):
    summary = pl.read_parquet(sm.input.summary)
    auc = pl.read_parquet(sm.input.auc)
    p = sm.params
    plot_pathways(summary, auc, p.models, p.titles, sm.output.png, sm.output.pdf, caption=p.caption)
    plot_probe_auc(
        auc,
        p.models,
        p.titles,
        sm.output.auc_png,
        sm.output.auc_pdf,
        caption="Probe: logistic regression on standardized residual stream at the last exact answer "
        "token; line = mean test AUC over seeds, band = min..max. " + p.caption,
    )


runlog.run(snakemake, main)  # noqa: F821
