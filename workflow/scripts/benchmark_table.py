import polars as pl

from truthflow import runlog, validate

COLUMNS = {"s": "seconds", "cpu_s": "cpu_seconds", "max_rss": "max_rss_mb", "max_gpu": "max_gpu_mb"}


def main(sm):
    frames = [
        validate.read_tsv(path, list(COLUMNS), infer_schema_length=0).select(
            *(pl.lit(job[key]).alias(key) for key in ("rule", "model", "dataset")),
            *(pl.col(c).cast(pl.Float64, strict=False).alias(name) for c, name in COLUMNS.items()),
        )
        for path, job in zip(sm.input.tables, sm.params.jobs, strict=True)
    ]
    (pl.concat(frames) if frames else pl.DataFrame()).write_csv(sm.output[0], separator="\t")


runlog.run(snakemake, main)  # noqa: F821
