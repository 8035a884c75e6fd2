import numpy as np
import polars as pl

from truthflow import runlog, validate
from truthflow.pathways import experiments as ex
from truthflow.pathways.detection import awareness_auc, detection_table


def main(sm):
    cfg = sm.params.experiments
    probe, boot = sm.params.probe, sm.params.bootstrap
    model, dataset = sm.wildcards.model, sm.wildcards.dataset
    name = f"{model}/{dataset}"
    samples = validate.read_parquet(sm.input.samples, ["id", "correct", "refusal"])
    scores = validate.read_parquet(sm.input.scores, ["id", "layer"])
    deltap = validate.read_parquet(sm.input.deltap, ["id", "layer", "knockout", "anchor"])
    data = validate.read_parquet(sm.input.data, ["id"])
    rows_why = f", one row per sample of {sm.input.samples}"
    clean = validate.load_npy(sm.input.resid_clean, (samples.height, None, None), "float16", why=rows_why)
    ids = samples["id"].to_list()
    keys = [pl.lit(model).alias("model"), pl.lit(dataset).alias("dataset")]
    empty = (
        ex.rows_frame([]),
        pl.DataFrame(schema={"layer": pl.Int64, "seed": pl.Int64, "auc": pl.Float64, "status": pl.String}),
        pl.DataFrame(schema={"method": pl.String, "seed": pl.Int64, "auc": pl.Float64, "status": pl.String}),
        pl.DataFrame(schema={"id": pl.String, "group": pl.String, "correct": pl.Boolean}),
    )
    if samples.height == 0 or scores.height == 0 or deltap.height == 0:
        why = "no samples" if samples.height == 0 else "probe undefined (no ΔP rows)"
        print(f"{name}: experiments skipped: {why}", flush=True)
        rows, aware, det, per_sample = empty
    else:
        if scores["id"].to_list() != ids:
            raise validate.bad_file(sm.input.scores, f"its ids differ from those of {sm.input.samples}")
        layer = int(scores["layer"][0])
        n_layers = clean.shape[1]
        labels = samples["correct"].to_numpy().astype(int)
        groups = ex.groups_at(deltap, ids, layer)
        print(
            f"{name}: layer {layer}: {int(groups.sum())} Q-Anchored, {int((~groups).sum())} A-Anchored",
            flush=True,
        )
        nb, seed = boot["n"], boot["seed"]
        fit = (probe["test_size"], probe["C"], probe["max_iter"])
        rows: list[dict] = []
        patch = validate.load_npy(sm.input.patch, (2, None, clean.shape[2]), "float16")
        ao = validate.load_npy(sm.input.answer_only, (None, clean.shape[2]), "float16")
        pr = validate.load_npy(sm.input.pr, (None, None, clean.shape[2]), "float16")
        states = []
        if cfg["patching"] and patch.shape[1] == len(ids):
            states += [patch[0], patch[1]]
        if cfg["answer_only"] and ao.shape[0] == len(ids):
            states.append(ao)
        undefined = len(set(labels.tolist())) < 2
        if undefined:
            print(f"{name}: one answer class only: probe-based experiments undefined", flush=True)
        elif states:
            prob, new = ex.probe_at_layer(clean, layer, states, labels, probe)
            k = 0
            if cfg["patching"] and patch.shape[1] == len(ids):
                control_ok = scores["patch_control_matched"].to_numpy()
                rows += ex.patching_rows(prob, new[0], new[1], labels, groups, control_ok, layer, nb, seed)
                k = 2
            if cfg["answer_only"] and ao.shape[0] == len(ids):
                rows += ex.answer_only_rows(prob, new[k], groups, layer, nb, seed)
        if cfg["boundary"]:
            pop = None
            if "s_pop" in data.columns:
                pop = dict(zip(data["id"].to_list(), data["s_pop"].cast(pl.Float64).to_list(), strict=True))
            correct = dict(zip(ids, samples["correct"].to_list(), strict=True))
            refusal = dict(zip(ids, samples["refusal"].to_list(), strict=True))
            rows += ex.boundary_rows(deltap, correct, refusal, pop, layer, nb, seed)
        per_sample = pl.DataFrame(
            {
                "id": ids,
                "group": np.where(groups, ex.Q_ANCHORED, ex.A_ANCHORED),
                "correct": labels.astype(bool),
            }
        )
        if cfg["saliency"] and "s_eq_ea" in scores.columns:
            s_ea = np.array([np.mean(v) if v else np.nan for v in scores["s_eq_ea"].to_list()])
            s_all = np.array([np.mean(v) if v else np.nan for v in scores["s_eq_all"].to_list()])
            rows += ex.saliency_rows(s_ea, s_all, groups, layer, nb, seed)
            per_sample = per_sample.with_columns(pl.Series("s_eq_ea", s_ea), pl.Series("s_eq_all", s_all))
        if "s_pop" in data.columns:
            per_sample = per_sample.join(
                data.select("id", pl.col("s_pop").cast(pl.Float64)), on="id", how="left"
            )
        aware = empty[1]
        if cfg["awareness"]:
            others = [lay for lay in range(1, n_layers + 1) if lay != layer]
            aware = awareness_auc(clean, groups, others, probe["seeds"], *fit)
        det = empty[2]
        if cfg["detection"] and "p_true" in scores.columns and not undefined:
            factors = [float(f) for f in cfg["pr_factors"]]
            pr_states = {f: (pr[2 * i], pr[2 * i + 1]) for i, f in enumerate(factors)}
            baselines = {
                "P(True)": scores["p_true"].to_numpy(),
                "Logits-mean": scores["logit_mean"].to_numpy(),
                "Logits-min": scores["logit_min"].to_numpy(),
            }
            x = np.asarray(clean[:, layer - 1], dtype=np.float32)
            det = detection_table(
                x,
                labels,
                groups,
                pr_states,
                baselines,
                probe["seeds"],
                factors,
                *fit,
            )
        rows = ex.rows_frame(rows)
        for r in rows.filter(pl.col("experiment") != "boundary").iter_rows(named=True):
            print(
                f"{name}: {r['experiment']} {r['condition']} {r['group']}: {r['value']:.3g} "
                f"[{r['ci_low']:.3g}, {r['ci_high']:.3g}] n={r['n']}",
                flush=True,
            )
    runlog.write_parquet(rows.select(*keys, pl.all()), sm.output.rows)
    runlog.write_parquet(aware.select(*keys, pl.all()), sm.output.awareness)
    runlog.write_parquet(det.select(*keys, pl.all()), sm.output.detection)
    runlog.write_parquet(per_sample.select(*keys, pl.all()), sm.output.per_sample)


runlog.run(snakemake, main)  # noqa: F821
