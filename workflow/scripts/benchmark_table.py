import polars as pl

from truthflow import runlog, validate


def main(sm):
    frames = [
        validate.read_tsv(path, ["s", "max_rss"], infer_schema_length=0).select(
            *(pl.lit(job[key]).alias(key) for key in ("rule", "model", "dataset")),
            pl.col("s").cast(pl.Float64).alias("seconds"),
            pl.col("max_rss").cast(pl.Float64, strict=False).alias("max_rss_mb"),
        )
        for path, job in zip(sm.input.tables, sm.params.jobs, strict=True)
    ]
    (pl.concat(frames) if frames else pl.DataFrame()).write_csv(sm.output[0], separator="\t")


runlog.run(snakemake, main)  # noqa: F821
