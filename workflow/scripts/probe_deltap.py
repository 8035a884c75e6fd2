import polars as pl

from truthflow import runlog, validate
from truthflow.pathways import activations, states
from truthflow.pathways.check import check
from truthflow.pathways.probes import run_probes, summarize


def main(sm):
    samples = validate.read_parquet(sm.input.samples, ["id", "correct", "control_matched"])
    clean, ko, control = activations.read_resid(sm.input, samples.height, sm.input.samples)
    cfg = sm.params.cfg
    labels, matched = samples["correct"].to_numpy().astype(int), samples["control_matched"].to_numpy()
    split = {"split": cfg["anchor_split"], "fixed_layer": cfg["fixed_layer"]}
    auc, per_sample = run_probes(
        clean, [ko, *control], labels, samples["id"], cfg["probe"], matched, workers=sm.threads, **split
    )
    summary = summarize(per_sample, cfg["bootstrap"]["n"], cfg["bootstrap"]["seed"])
    status = auc["status"][0] if auc.height and auc["status"][0] != "ok" else None
    # the check's per-cell statistics; the verdicts need every cell (Holm): rule pathways_tables
    cells = check(per_sample, auc, cfg["check"]["layers"], probe_status=status)
    model, dataset = sm.wildcards.model, sm.wildcards.dataset
    print(auc.group_by("status").len(), flush=True)
    stats = cells.select("layers", "measure", "n_samples", "n_minority", "probe_auc", "diff", "sd", "status")
    print(f"{model}/{dataset}: E_Q − control, per-cell statistics", stats, sep="\n", flush=True)
    keys = [pl.lit(model).alias("model"), pl.lit(dataset).alias("dataset")]
    for table, name in ((auc, "auc"), (per_sample, "deltap"), (summary, "summary"), (cells, "check")):
        table.select(*keys, pl.all()).write_parquet(sm.output[name])
    states.write_settings(sm.output.settings, cfg)


runlog.run(snakemake, main)  # noqa: F821
