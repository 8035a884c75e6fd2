from truthflow import runlog, validate
from truthflow.jobs import load_job_model
from truthflow.pathways import activations
from truthflow.pathways.experiments import SALIENCY_SCHEMA, experiment_layer
from truthflow.pathways.extract import experiment_states


def main(sm):
    cfg = sm.params.experiments
    model, dataset = sm.wildcards.model, sm.wildcards.dataset
    columns = ["id", "correct", "eq_positions", "probe_position", "control_positions"]
    samples = validate.read_parquet(sm.input.samples, [*columns, "control_matched"])
    labels = validate.read_parquet(sm.input.labels, ["id", "prompt_ids", "answer_ids", "answer"])
    questions = validate.read_parquet(sm.input.data, ["id", "question"])
    auc = validate.read_parquet(sm.input.auc, ["layer", "auc", "status"])
    saliency = validate.read_parquet(sm.input.saliency, list(SALIENCY_SCHEMA))
    missing = set(samples["id"]) - set(saliency["id"])  # a left join would give those samples nulls
    if missing:
        raise validate.bad_file(
            sm.input.saliency,
            f"{len(missing)} of the {samples.height} samples of {sm.input.samples} have no row in it "
            f"(first: {sorted(missing)[0]!r})",
        )
    table = (
        samples.join(labels, on="id", how="left")
        .join(questions.select("id", "question"), on="id", how="left")
        .join(saliency, on="id", how="left")
    )
    lm, bs, name = load_job_model(sm), sm.resources.batch_size, f"{model}/{dataset}"
    layer, why = experiment_layer(cfg["layer"], auc, lm.info["n_layers"], model)
    print(f"{name}: experiments at layer {layer} ({why})", flush=True)
    shapes = activations.experiment_shapes(table.height, lm.info["hidden_size"], len(cfg["pr_factors"]))
    with activations.written(sm.output, shapes, lm.model.dtype) as outs:
        scores = experiment_states(
            lm, table, layer, cfg, bs, sm.params.chat, sm.params.chat_template_kwargs, outs, name
        )
    scores.write_parquet(sm.output.scores)


runlog.run(snakemake, main)  # noqa: F821
