import time

import numpy as np
import polars as pl

from truthflow import runlog, validate
from truthflow.models import load_model
from truthflow.pathways.extract import extract, locate_all

_POS = pl.List(pl.Int64)
EMPTY_SAMPLES = {"id": pl.String, "correct": pl.Boolean, "refusal": pl.Boolean, "eq_positions": _POS,
                 "ea_positions": _POS, "probe_position": pl.Int64, "question_positions": _POS,
                 "eq_text": pl.String, "ea_text": pl.String, "blocked_positions": _POS,
                 "control_positions": pl.List(_POS), "control_matched": pl.Boolean, "n_eq": pl.Int64,
                 "n_ea": pl.Int64}  # fmt: skip


def main(sm):
    labels = ["id", "prompt", "answer", "prompt_ids", "answer_ids", "correct", "match_start", "refusal"]
    labelled = validate.read_parquet(sm.input.labels, labels)
    questions = validate.read_parquet(sm.input.data, ["id", "dataset", "question"]).drop("dataset")
    validate.check_ids(labelled, sm.input.labels, "id", questions["id"], sm.input.data)
    table = labelled.join(questions, on="id", how="left")
    lm = load_model(
        sm.input.model,
        sm.params.dtype,
        gpus=sm.resources.gpu,
        threads=sm.resources.get("torch_threads") or sm.threads,
    )
    name = f"{sm.wildcards.model}/{sm.wildcards.dataset}"
    kept, dropped = locate_all(
        lm,
        sm.params.chat,
        sm.wildcards.dataset,
        table,
        sm.params.extractor,
        sm.resources.batch_size,
        sm.params.extractor_template_kwargs,
    )
    n_kept = 0 if kept is None else kept.height
    print(f"{name}: {n_kept} samples kept, {dropped.height} dropped", flush=True)
    if dropped.height:
        print(dropped.group_by("reason").len(), flush=True)
    shape = (n_kept, lm.info["n_layers"], lm.info["hidden_size"])
    cfg = sm.params.knockout
    draws = cfg["control_draws"]
    # residual streams go straight to memory-mapped .npy files, batch by batch: memory stays bounded for
    # datasets of any size; the files appear under their final names only when complete
    with (
        runlog.atomic(sm.output.resid_clean) as tmp_clean,
        runlog.atomic(sm.output.resid_ko) as tmp_ko,
        runlog.atomic(sm.output.resid_control) as tmp_ctrl,
    ):
        clean = np.lib.format.open_memmap(tmp_clean, mode="w+", dtype=np.float16, shape=shape)
        ko = np.lib.format.open_memmap(tmp_ko, mode="w+", dtype=np.float16, shape=shape)
        ctrl = np.lib.format.open_memmap(tmp_ctrl, mode="w+", dtype=np.float16, shape=(draws, *shape))
        if n_kept:
            t0 = time.perf_counter()
            _, _, target_blocks, controls, matched = extract(
                lm,
                kept,
                sm.resources.batch_size,
                cfg["mode"],
                cfg["window"],
                cfg["target"],
                draws,
                cfg["control_seed"],
                desc=f"knockout {name}",
                out=(clean, [ko, *(ctrl[d] for d in range(draws))]),
            )
            dt = time.perf_counter() - t0
            print(
                f"{name}: clean + {1 + draws} knockout passes over {n_kept} samples in {dt:.1f} s "
                f"({n_kept / dt:.1f} samples/s)",
                flush=True,
            )
            n_unmatched = len(matched) - sum(matched)
            if n_unmatched:
                print(
                    f"{name}: {n_unmatched} samples have fewer non-E_Q question tokens than |E_Q|: no matched"
                    " random control; they are left out of the E_Q-vs-control check (counted there)",
                    flush=True,
                )
            kept = kept.with_columns(
                pl.Series("blocked_positions", target_blocks, dtype=pl.List(pl.Int64)),
                pl.Series(
                    "control_positions",
                    [list(c) for c in zip(*controls, strict=True)] if draws else [[] for _ in matched],
                    dtype=pl.List(pl.List(pl.Int64)),
                ),
                pl.Series("control_matched", matched, dtype=pl.Boolean),
                pl.Series("n_eq", [len(e) for e in kept["eq_positions"].to_list()], dtype=pl.Int64),
                pl.Series("n_ea", [len(e) for e in kept["ea_positions"].to_list()], dtype=pl.Int64),
            ).drop("seq")
        else:
            kept = pl.DataFrame(schema=EMPTY_SAMPLES)  # every column the later rules read
        for arr in (clean, ko, ctrl):
            arr.flush()
        del clean, ko, ctrl
    runlog.write_parquet(kept, sm.output.samples)
    runlog.write_parquet(
        dropped.with_columns(
            pl.lit(sm.wildcards.model).alias("model"), pl.lit(sm.wildcards.dataset).alias("dataset")
        ),
        sm.output.dropped,
    )


runlog.run(snakemake, main)  # noqa: F821
