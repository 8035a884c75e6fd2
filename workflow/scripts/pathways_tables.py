import polars as pl

from truthflow import runlog, validate
from truthflow.pathways.check import CELL_SCHEMA, dropped_table, family, rounded
from truthflow.pathways.probes import AUC_SCHEMA, SUMMARY_SCHEMA, auc_by_layer
from truthflow.pathways.spans import CLASS_TABLE_SCHEMA, class_table

KEYS = ["model", "dataset"]


def _concat(paths, columns) -> pl.DataFrame:
    return pl.concat([validate.read_parquet(p, columns) for p in paths], how="diagonal_relaxed")


def main(sm):
    summary = _concat(sm.input.summary, [*KEYS, *SUMMARY_SCHEMA])
    auc = _concat(sm.input.auc, [*KEYS, *AUC_SCHEMA])
    cells = _concat(sm.input.check, [*KEYS, *CELL_SCHEMA])
    check, by_layers = family(cells, sm.params.check)  # the verdicts: Holm needs every cell
    samples = [validate.read_parquet(p, ["id", "correct", "n_ea"]) for p in sm.input.samples]
    kept = [(m, d, s.height) for (m, d), s in zip(sm.params.runs, samples, strict=True)]
    schema = {"dataset": pl.String, "reason": pl.String, "detail": pl.String}
    data_dropped = (
        _concat(sm.input.data_dropped, list(schema)) if sm.input.data_dropped else pl.DataFrame(schema=schema)
    )
    dropped = dropped_table(kept, _concat(sm.input.dropped, [*KEYS, "reason"]), data_dropped)
    classes = [class_table(s, m, d) for (m, d), s in zip(sm.params.runs, samples, strict=True) if s.height]
    classes = pl.concat([pl.DataFrame(schema=CLASS_TABLE_SCHEMA), *classes]).sort("model", "dataset", "class")
    summary.write_parquet(sm.output.summary)
    auc.write_parquet(sm.output.auc)
    check.write_parquet(sm.output.check)
    auc_by_layer(auc).write_csv(sm.output.auc_tsv, separator="\t")
    dropped.write_csv(sm.output.dropped, separator="\t")
    rounded(check).write_csv(sm.output.check_tsv, separator="\t")
    rounded(by_layers).write_csv(sm.output.check_layers, separator="\t")
    classes.write_csv(sm.output.exact_tokens, separator="\t")
    for r in check.iter_rows(named=True):
        print(f"{r['model']}/{r['dataset']}: {r['verdict']} ({r['reason']})", flush=True)


runlog.run(snakemake, main)  # noqa: F821
