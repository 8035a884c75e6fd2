import polars as pl

from truthflow import runlog
from truthflow.labels import accuracy_table, label_frame


def main(sm):
    labelled = label_frame(pl.read_parquet(sm.input.answers), pl.read_parquet(sm.input.data))
    acc = accuracy_table(labelled, sm.wildcards.model, sm.wildcards.dataset)
    print(acc, flush=True)
    runlog.write_parquet(labelled, sm.output.labels)
    runlog.write_tsv(acc, sm.output.accuracy)


runlog.run(snakemake, main)  # noqa: F821
