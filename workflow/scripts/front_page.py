from pathlib import Path

from truthflow import front_page, runlog, validate

CHECK = ["model", "dataset", "measure", "layers", "n_samples", "diff", "diff_low", "diff_high", "p_holm"]


def main(sm):
    compared = validate.read_tsv(sm.input.compared, ["paper", "kind", "check", "model", "verdict"])
    check = layers = None
    if sm.input.check:  # the pathways stage ran
        check = validate.read_tsv(sm.input.check, [*CHECK, "sesoi", "verdict", "reason"])
        layers = validate.read_tsv(sm.input.layers, ["model", "dataset", "layers", "verdict"])
    page = front_page.render(compared, check, layers, sm.params.links)
    Path(sm.output[0]).write_text(page, encoding="utf-8")


runlog.run(snakemake, main)  # noqa: F821
