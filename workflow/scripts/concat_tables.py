import polars as pl

from truthflow import runlog, validate


def main(sm):
    frames = [validate.read_tsv(p, ["model", "dataset", "n", "accuracy"]) for p in sm.input.tables]
    pl.concat(frames, how="diagonal_relaxed").write_csv(sm.output[0], separator="\t")


runlog.run(snakemake, main)  # noqa: F821
