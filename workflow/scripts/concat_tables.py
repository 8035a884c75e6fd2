import polars as pl

from truthflow import runlog, validate


def main(sm):
    frames = [validate.read_tsv(p, ["model", "dataset", "n", "accuracy"]) for p in sm.input.tables]
    runlog.write_tsv(pl.concat(frames, how="diagonal_relaxed"), sm.output[0])


runlog.run(snakemake, main)  # noqa: F821
