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
    kept, dropped = locate_all(
        lm, sm.params.chat, sm.wildcards.dataset, table, sm.params.extractor, sm.resources.batch_size
    )
    n_kept = 0 if kept is None else kept.height
    print(f"{name}: {n_kept} samples kept, {dropped.height} dropped", flush=True)
    if dropped.height:
        print(dropped.group_by("reason").len(), flush=True)
    shape = (n_kept, lm.info["n_layers"], lm.info["hidden_size"])
    # residual streams go straight to memory-mapped .npy files, batch by batch: memory stays bounded for
    # datasets of any size; the files appear under their final names only when complete
    with runlog.atomic(sm.output.resid_clean) as tmp_clean, runlog.atomic(sm.output.resid_ko) as tmp_ko:
        clean = np.lib.format.open_memmap(tmp_clean, mode="w+", dtype=np.float16, shape=shape)
        ko = np.lib.format.open_memmap(tmp_ko, mode="w+", dtype=np.float16, shape=shape)
        if n_kept:
            t0 = time.perf_counter()
            cfg = sm.params.knockout
            _, _, blocks = extract(
                lm,
                kept,
                sm.resources.batch_size,
                cfg["mode"],
                cfg["window"],
                cfg["control"],
                cfg["control_seed"],
                desc=f"knockout {name}",
                out=(clean, ko),
            )
            dt = time.perf_counter() - t0
            print(
                f"{name}: clean + knockout sweep of {n_kept} samples in {dt:.1f} s "
                f"({n_kept / dt:.1f} samples/s)",
                flush=True,
            )
            kept = kept.with_columns(pl.Series("blocked_positions", blocks, dtype=pl.List(pl.Int64))).drop(
                "seq"
            )
        else:
            kept = pl.DataFrame(schema={"id": pl.String, "correct": pl.Boolean})
        clean.flush()
        ko.flush()
        del clean, ko
    runlog.write_parquet(kept, sm.output.samples)
    runlog.write_parquet(
        dropped.with_columns(
            pl.lit(sm.wildcards.model).alias("model"), pl.lit(sm.wildcards.dataset).alias("dataset")
        ),
        sm.output.dropped,
    )


runlog.run(snakemake, main)  # noqa: F821
