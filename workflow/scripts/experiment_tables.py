import polars as pl

from truthflow import registry, runlog, validate
from truthflow.pathways.detection import AWARENESS_SCHEMA, DETECTION_SCHEMA, awareness_summary, table3
from truthflow.pathways.experiments import PER_SAMPLE_SCHEMA, ROW_SCHEMA, TABLE_KEYS


def _concat(paths, schema) -> pl.DataFrame:
    frames = [validate.read_parquet(p, [*TABLE_KEYS, *schema]) for p in paths]
    filled = [f for f in frames if f.height]
    # no rows anywhere (every pair undefined): an empty table that keeps its columns
    return pl.concat(filled, how="diagonal_relaxed") if filled else frames[0]


def main(sm):
    rows = _concat(sm.input.rows, ROW_SCHEMA)
    aware = _concat(sm.input.awareness, AWARENESS_SCHEMA)
    det = _concat(sm.input.detection, DETECTION_SCHEMA)
    rows.write_parquet(sm.output.rows)
    rows.write_csv(sm.output.rows_tsv, separator="\t")
    aware.write_parquet(sm.output.awareness)
    awareness_summary(aware).write_csv(sm.output.awareness_tsv, separator="\t")
    det.write_parquet(sm.output.detection)
    t3 = table3(det, {ds: registry.get(ds).display for ds in registry.qa_names()})
    t3.write_csv(sm.output.table3, separator="\t")
    _concat(sm.input.per_sample, PER_SAMPLE_SCHEMA).write_parquet(sm.output.per_sample)
    if t3.height:
        print(t3, flush=True)


runlog.run(snakemake, main)  # noqa: F821
