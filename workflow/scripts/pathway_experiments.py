from truthflow import runlog, validate
from truthflow.pathways import activations, experiments
from truthflow.pathways.states import write_settings


def main(sm):
    samples = validate.read_parquet(sm.input.samples, ["id", "correct", "refusal"])
    scores = validate.read_parquet(sm.input.scores, list(experiments.SCORES_SCHEMA))
    deltap = validate.read_parquet(sm.input.deltap, ["id", "layer", "knockout", "anchor"])
    data = validate.read_parquet(sm.input.data, ["id"])
    if scores["id"].to_list() != samples["id"].to_list():
        raise validate.bad_file(sm.input.scores, f"its ids differ from those of {sm.input.samples}")
    n, factors = samples.height, [float(f) for f in sm.params.experiments["pr_factors"]]
    (clean,) = activations.read_resid(sm.input, n, sm.input.samples, names=["resid_clean"])
    exp_states = activations.read_experiment(sm.input, n, clean.shape[2], len(factors), sm.input.samples)
    keys = {"model": sm.wildcards.model, "dataset": sm.wildcards.dataset}
    tables = experiments.run(
        samples,
        scores,
        deltap,
        data,
        clean,
        exp_states,
        sm.params.probe,
        sm.params.bootstrap,
        factors,
        keys,
        workers=sm.threads,
    )
    for table, name in zip(tables, ("rows", "awareness", "detection", "per_sample"), strict=True):
        table.write_parquet(sm.output[name])
    write_settings(sm.output.settings, dict(sm.params.items()))


runlog.run(snakemake, main)  # noqa: F821
