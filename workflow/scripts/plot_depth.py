from truthflow import report_tables, runlog, validate
from truthflow.depth.plots import plot_depth_boxes, plot_score_gap_density


def main(sm):
    p = sm.params

    def out(fig: str):
        cap = report_tables.caption(sm.input[f"{fig}_caption"], p.caption) if p.show_caption else ""
        return sm.output[f"{fig}_png"], sm.output[f"{fig}_pdf"], cap

    depthwise = validate.read_parquet(sm.input.depthwise, ["model", "group", "depth", "mink"])
    plot_depth_boxes(depthwise, p.models, p.titles, *out("depth_mink_boxes"))
    subsets = validate.read_parquet(sm.input.subsets, ["model", "group", "subset", "side", "gap"])
    plot_score_gap_density(subsets, p.models, p.titles, *out("depth_score_gap_density"))


runlog.run(snakemake, main)  # noqa: F821
