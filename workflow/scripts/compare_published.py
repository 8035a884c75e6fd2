import polars as pl

from truthflow import runlog
from truthflow.compare import compare


def main(sm):
    published = pl.read_csv(sm.input.published, separator="\t")
    pathways = pl.read_parquet(sm.input.pathways) if sm.input.pathways else None
    depthwise = pl.read_parquet(sm.input.depthwise) if sm.input.depthwise else None
    pooled = pl.read_csv(sm.input.pooled, separator="\t") if sm.input.pooled else None
    check = pl.read_parquet(sm.input.check) if sm.input.check else None
    table = compare(published, pathways, depthwise, pooled, check)
    with pl.Config(tbl_rows=100, tbl_width_chars=200, fmt_str_lengths=80):
        print(table.select("check", "model", "dataset", "reproduced", "verdict"), flush=True)
    runlog.write_tsv(table, sm.output[0])


runlog.run(snakemake, main)  # noqa: F821
