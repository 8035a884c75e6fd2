import polars as pl

from truthflow import runlog, validate
from truthflow.compare import compare

# compare's tables: the input of that name (None where its stage is off) and the columns it needs
COLUMNS = {
    "pathways": ["model", "dataset", "knockout", "layer"],
    "check": ["model", "dataset", "verdict"],
    "rows": ["model", "dataset", "experiment", "condition", "group", "value"],
    "awareness": ["model", "dataset", "layer", "auc"],
    "detection": ["model", "dataset", "method", "auc", "status"],
    "depthwise": ["model", "depth", "mink"],
    "pooled": ["model", "depth", "median"],
    "depth_metrics": ["model", "metric", "scope", "depth", "n", "value"],
}
# the judge stage alone, over released answers (depth.released_answers): compared as the depth metrics are
RELEASED = "released"


def main(sm):
    published = validate.read_tsv(sm.input.published, ["kind", "paper", "model", "published"])
    tables = {}
    for name, columns in COLUMNS.items():
        read = validate.read_tsv if name == "pooled" else validate.read_parquet
        tables[name] = read(sm.input[name], columns) if sm.input[name] else None
    if sm.input[RELEASED]:  # a model's answers are released or generated, never both (config.check_names)
        released = validate.read_parquet(sm.input[RELEASED], COLUMNS["depth_metrics"])
        both = [t for t in (tables["depth_metrics"], released) if t is not None]
        tables["depth_metrics"] = pl.concat(both, how="diagonal_relaxed")
    table = compare(published, tables)
    with pl.Config(tbl_rows=100, tbl_width_chars=200, fmt_str_lengths=80):
        print(table.select("check", "model", "dataset", "reproduced", "verdict"), flush=True)
    table.write_csv(sm.output[0], separator="\t")


runlog.run(snakemake, main)  # noqa: F821
