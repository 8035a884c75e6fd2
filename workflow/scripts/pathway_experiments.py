from truthflow import runlog, validate
from truthflow.pathways import experiments


def main(sm):
    samples = validate.read_parquet(sm.input.samples, ["id", "correct", "refusal"])
    scores = validate.read_parquet(sm.input.scores, list(experiments.SCORES_SCHEMA))
    deltap = validate.read_parquet(sm.input.deltap, ["id", "layer", "knockout", "anchor"])
    data = validate.read_parquet(sm.input.data, ["id"])
    if scores["id"].to_list() != samples["id"].to_list():
        raise validate.bad_file(sm.input.scores, f"its ids differ from those of {sm.input.samples}")
    rows_why = f", one row per sample of {sm.input.samples}"
    clean = validate.load_npy(sm.input.resid_clean, (samples.height, None, None), "float16", why=rows_why)
    n, hidden = samples.height, clean.shape[2]
    factors = [float(f) for f in sm.params.experiments["pr_factors"]]
    states = (
        validate.load_npy(sm.input.patch, (2, n, hidden), "float16", why=rows_why),
        validate.load_npy(sm.input.answer_only, (n, hidden), "float16", why=rows_why),
        validate.load_npy(sm.input.pr, (2 * len(factors), n, hidden), "float16", why=rows_why),
    )
    keys = {"model": sm.wildcards.model, "dataset": sm.wildcards.dataset}
    tables = experiments.run(
        samples, scores, deltap, data, clean, states, sm.params.probe, sm.params.bootstrap, factors, keys
    )
    for table, name in zip(tables, ("rows", "awareness", "detection", "per_sample"), strict=True):
        table.write_parquet(sm.output[name])


runlog.run(snakemake, main)  # noqa: F821
