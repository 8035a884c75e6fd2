import polars as pl

from truthflow import runlog, validate


def main(sm):
    frames = [
        validate.read_tsv(path, runlog.BENCHMARK_COLUMNS, infer_schema_length=0, null_values="NA").select(
            *(pl.lit(job[key]).alias(key) for key in ("rule", "model", "dataset")),
            pl.col(runlog.BENCHMARK_COLUMNS).cast(pl.Float64),
        )
        for path, job in zip(sm.input.tables, sm.params.jobs, strict=True)
    ]
    (pl.concat(frames) if frames else pl.DataFrame()).write_csv(sm.output[0], separator="\t")


runlog.run(snakemake, main)  # noqa: F821
