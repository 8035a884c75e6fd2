from truthflow import runlog, validate
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
    cap = p.caption if p.show_caption else ""

    def caption(text: str) -> str:
        return f"{text} {cap}" if p.show_caption else ""

    plot_pathways(summary, auc, p.models, p.titles, sm.output.png, sm.output.pdf, caption=cap)
    plot_anchored(
        summary,
        auc,
        p.models,
        p.titles,
        sm.output.control_png,
        sm.output.control_pdf,
        caption=caption(
            "Random-token control: |E_Q| random non-E_Q question tokens knocked out instead of E_Q."
        ),
        knockout="control",
    )
    plot_check(
        summary,
        check,
        auc,
        p.models,
        p.titles,
        sm.output.check_png,
        sm.output.check_pdf,
        caption=caption(
            "Falsification test: unsplit mean ΔP and flip rate over the same matched samples, E_Q knockout"
            f" vs random-token control. {check_caption(check, p.check)}"
        ),
        target_label="E_Q knockout"
        if p.target == "exact_question"
        else "random-token target (negative control)",
    )
    plot_probe_auc(
        auc,
        p.models,
        p.titles,
        sm.output.auc_png,
        sm.output.auc_pdf,
        caption=caption(
            "Probe: logistic regression on the standardized residual stream at the last exact answer token, "
            "cross-fitted; line = mean out-of-fold AUC over seeds, band = min..max."
        ),
    )


runlog.run(snakemake, main)  # noqa: F821
