from pathlib import Path

from truthflow import report_tables, runlog, validate
from truthflow.depth.plots import plot_depth_boxes, plot_score_gap_density


def main(sm):
    p = sm.params

    def caption(fig: str) -> str:
        return report_tables.caption(Path(p.report, f"{fig}.rst"), p.caption) if p.show_caption else ""

    depthwise = validate.read_parquet(sm.input.depthwise, ["model", "group", "depth", "mink"])
    plot_depth_boxes(
        depthwise, p.models, p.titles, sm.output.boxes_png, sm.output.boxes_pdf, caption("depth_boxes")
    )
    subsets = validate.read_parquet(sm.input.subsets, ["model", "group", "subset", "side", "gap"])
    plot_score_gap_density(
        subsets, p.models, p.titles, sm.output.gap_png, sm.output.gap_pdf, caption("depth_gap")
    )


runlog.run(snakemake, main)  # noqa: F821
