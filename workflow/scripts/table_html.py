from truthflow import runlog
from truthflow.report_tables import tsv_to_html


def main(sm):
    with runlog.atomic(sm.output[0]) as tmp:
        tsv_to_html(sm.input.table, tmp, sm.params.title, sm.params.caption)


runlog.run(snakemake, main)  # noqa: F821
