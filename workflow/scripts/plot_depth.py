from truthflow import runlog, validate
from truthflow.depth.plots import plot_depth_boxes, plot_score_gap_density


def main(sm):
    p = sm.params
    plot_depth_boxes(
        validate.read_parquet(sm.input.depthwise, ["model", "group", "depth", "mink"]),
        p.models,
        p.titles,
        sm.output.boxes_png,
        sm.output.boxes_pdf,
        caption=p.caption if p.show_caption else "",
    )
    plot_score_gap_density(
        validate.read_parquet(sm.input.subsets, ["model", "group", "subset", "side", "gap"]),
        p.models,
        p.titles,
        sm.output.gap_png,
        sm.output.gap_pdf,
        caption=p.caption if p.show_caption else "",
    )


runlog.run(snakemake, main)  # noqa: F821
