from truthflow import runlog
from truthflow.report_tables import tsv_to_html


def main(sm):
    tsv_to_html(sm.input.table, sm.output[0], sm.params.title, sm.params.caption)


runlog.run(snakemake, main)  # noqa: F821
