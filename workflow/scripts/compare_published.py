import polars as pl

from truthflow import runlog, validate
from truthflow.compare import compare


def main(sm):
    published = validate.read_tsv(sm.input.published, ["kind", "model", "published"])
    read = validate.read_parquet
    pathways = (
        read(sm.input.pathways, ["model", "dataset", "knockout", "layer"]) if sm.input.pathways else None
    )
    depthwise = read(sm.input.depthwise, ["model", "depth", "mink"]) if sm.input.depthwise else None
    pooled = validate.read_tsv(sm.input.pooled, ["model", "depth", "median"]) if sm.input.pooled else None
    check = read(sm.input.check, ["model", "dataset", "verdict"]) if sm.input.check else None
    experiments = {}
    if sm.input.experiments:
        experiments = {
            "rows": read(
                sm.input.experiments, ["model", "dataset", "experiment", "condition", "group", "value"]
            ),
            "awareness": read(sm.input.awareness, ["model", "dataset", "layer", "auc"]),
            "detection": read(sm.input.detection, ["model", "dataset", "method", "auc", "status"]),
        }
    table = compare(published, pathways, depthwise, pooled, check, experiments)
    with pl.Config(tbl_rows=100, tbl_width_chars=200, fmt_str_lengths=80):
        print(table.select("check", "model", "dataset", "reproduced", "verdict"), flush=True)
    table.write_csv(sm.output[0], separator="\t")


runlog.run(snakemake, main)  # noqa: F821
