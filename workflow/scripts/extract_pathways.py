import time

import numpy as np
import polars as pl

from truthflow import runlog
from truthflow.models import load_model
from truthflow.pathways import extract, locate_all


def main(sm):
    labelled = pl.read_parquet(sm.input.labels)
    questions = pl.read_parquet(sm.input.data).drop("dataset")
    table = labelled.join(questions, on="id", how="left")
    lm = load_model(sm.input.model, sm.params.dtype, gpus=sm.resources.gpu, threads=sm.threads)
    name = f"{sm.wildcards.model}/{sm.wildcards.dataset}"
    kept, dropped = locate_all(lm, sm.params.chat, sm.wildcards.dataset, table, sm.params.extractor,
                               sm.resources.batch_size)
    print(f"{name}: {0 if kept is None else kept.height} samples kept, {dropped.height} dropped", flush=True)
    if dropped.height:
        print(dropped.group_by("reason").len(), flush=True)
    n_layers, hidden = lm.info["n_layers"], lm.info["hidden_size"]
    if kept is None or kept.height == 0:
        clean = ko = np.zeros((0, n_layers, hidden), dtype=np.float16)
        kept = pl.DataFrame(schema={"id": pl.String, "correct": pl.Boolean, "blocked_positions": pl.List(pl.Int64)})
    else:
        t0 = time.perf_counter()
        ko_cfg = sm.params.knockout
        clean, ko, blocks = extract(lm, kept, sm.resources.batch_size, ko_cfg["mode"], ko_cfg["window"],
                                    ko_cfg["control"], ko_cfg["control_seed"], desc=f"knockout {name}")
        dt = time.perf_counter() - t0
        print(f"{name}: clean + knockout sweep of {kept.height} samples in {dt:.1f} s "
              f"({kept.height / dt:.1f} samples/s)", flush=True)
        kept = kept.with_columns(pl.Series("blocked_positions", blocks, dtype=pl.List(pl.Int64))).drop("seq")
    runlog.write_parquet(kept, sm.output.samples)
    runlog.write_parquet(dropped.with_columns(pl.lit(sm.wildcards.model).alias("model"),
                                              pl.lit(sm.wildcards.dataset).alias("dataset")), sm.output.dropped)
    with runlog.atomic(sm.output.resid_clean) as tmp, open(tmp, "wb") as fh:
        np.save(fh, clean)
    with runlog.atomic(sm.output.resid_ko) as tmp, open(tmp, "wb") as fh:
        np.save(fh, ko)


runlog.run(snakemake, main)  # noqa: F821
