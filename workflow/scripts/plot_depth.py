import polars as pl

from truthflow import runlog
from truthflow.plots_depth import plot_depth_boxes, plot_score_gap_density


def main(sm):
    p = sm.params
    plot_depth_boxes(
        pl.read_parquet(sm.input.depthwise),
        p.models,
        p.titles,
        sm.output.boxes_png,
        sm.output.boxes_pdf,
        caption=p.caption if p.show_caption else "",
    )
    plot_score_gap_density(
        pl.read_parquet(sm.input.subsets),
        p.models,
        p.titles,
        sm.output.gap_png,
        sm.output.gap_pdf,
        caption=p.caption if p.show_caption else "",
    )


runlog.run(snakemake, main)  # noqa: F821
