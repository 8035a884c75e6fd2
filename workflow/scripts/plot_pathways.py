from truthflow import report_tables, runlog, validate
from truthflow.pathways.check import caption as check_caption
from truthflow.pathways.plots import plot_anchored, plot_check, plot_pathways, plot_probe_auc


def main(sm):
    summary = validate.read_parquet(
        sm.input.summary, ["model", "dataset", "knockout", "anchor", "layer", "n"]
    )
    auc = validate.read_parquet(sm.input.auc, ["model", "dataset", "seed", "layer", "auc", "status"])
    check = validate.read_parquet(
        sm.input.check, ["model", "dataset", "measure", "layers", "verdict", "diff", "diff_low", "diff_high"]
    )
    p = sm.params

    def out(fig: str, extra: str = ""):
        cap = report_tables.caption(sm.input[f"{fig}_caption"], p.caption, extra) if p.show_caption else ""
        return sm.output[f"{fig}_png"], sm.output[f"{fig}_pdf"], cap

    plot_pathways(summary, auc, p.models, p.titles, *out("pathways"))
    plot_anchored(summary, auc, p.models, p.titles, *out("pathways_control"), knockout="control")
    check_out = out("pathways_check", check_caption(check, p.check))
    plot_check(summary, check, auc, p.models, p.titles, *check_out, target=p.target)
    plot_probe_auc(auc, p.models, p.titles, *out("probe_auc"))


runlog.run(snakemake, main)  # noqa: F821
