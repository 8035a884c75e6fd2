from pathlib import Path

import polars as pl

from truthflow import runlog, validate


def main(sm):
    frames = []
    for path in sm.input.tables:
        parts = Path(path).parts  # results/<run>/benchmarks/<rule>/<model>[/<dataset>].tsv
        i = parts.index("benchmarks")
        rule, rest = parts[i + 1], parts[i + 2 :]
        model = rest[0].removesuffix(".tsv")
        dataset = rest[1].removesuffix(".tsv") if len(rest) > 1 else "depthqa"
        df = validate.read_tsv(path, ["s", "max_rss"], infer_schema_length=0)
        frames.append(
            df.select(
                pl.lit(rule).alias("rule"),
                pl.lit(model).alias("model"),
                pl.lit(dataset).alias("dataset"),
                pl.col("s").cast(pl.Float64).alias("seconds"),
                pl.col("max_rss").cast(pl.Float64, strict=False).alias("max_rss_mb"),
            )
        )
    runlog.write_tsv(pl.concat(frames) if frames else pl.DataFrame(), sm.output[0])


runlog.run(snakemake, main)  # noqa: F821
