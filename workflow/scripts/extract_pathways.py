import numpy as np
import polars as pl

from truthflow import runlog, validate
from truthflow.jobs import load_job_model
from truthflow.pathways.extract import extract, locate_all


def main(sm):
    labels = ["id", "prompt", "answer", "prompt_ids", "answer_ids", "correct", "match_start", "refusal"]
    labelled = validate.read_parquet(sm.input.labels, labels)
    questions = validate.read_parquet(sm.input.data, ["id", "dataset", "question"]).drop("dataset")
    validate.check_ids(labelled, sm.input.labels, "id", questions["id"], sm.input.data)
    table = labelled.join(questions, on="id", how="left")
    lm = load_job_model(sm)
    model, dataset = sm.wildcards.model, sm.wildcards.dataset
    kwargs = sm.params.extractor_template_kwargs
    bs = sm.resources.batch_size
    kept, dropped = locate_all(lm, sm.params.chat, dataset, table, sm.params.extractor, bs, kwargs)
    print(f"{model}/{dataset}: {kept.height} samples kept, {dropped.height} dropped", flush=True)
    if dropped.height:
        print(dropped.group_by("reason").len(), flush=True)
    shape = (kept.height, lm.info["n_layers"], lm.info["hidden_size"])
    draws = sm.params.knockout["control_draws"]
    # residual streams go straight to memory-mapped .npy files, batch by batch: memory stays bounded
    paths = (sm.output.resid_clean, sm.output.resid_ko, sm.output.resid_control)
    clean, ko, ctrl = (
        np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=s)
        for path, s in zip(paths, (shape, shape, (draws, *shape)), strict=True)
    )
    out = (clean, [ko, *(ctrl[d] for d in range(draws))])
    sal_bs = sm.params.saliency_batch_size
    samples, scores = extract(lm, kept, bs, sm.params.knockout, sal_bs, f"knockout {model}/{dataset}", out)
    for arr in (clean, ko, ctrl):
        arr.flush()
    samples.write_parquet(sm.output.samples)
    scores.write_parquet(sm.output.saliency)
    dropped.with_columns(model=pl.lit(model), dataset=pl.lit(dataset)).write_parquet(sm.output.dropped)


runlog.run(snakemake, main)  # noqa: F821
