import polars as pl

from truthflow import runlog, validate
from truthflow.jobs import load_job_model
from truthflow.pathways import activations
from truthflow.pathways.extract import knockout_states, locate_spans


def main(sm):
    labels = ["id", "prompt", "answer", "prompt_ids", "answer_ids", "correct", "match_start", "refusal"]
    labelled = validate.read_parquet(sm.input.labels, labels)
    questions = validate.read_parquet(sm.input.data, ["id", "dataset", "question"]).drop("dataset")
    validate.check_ids(labelled, sm.input.labels, "id", questions["id"], sm.input.data)
    table = labelled.join(questions, on="id", how="left")
    lm, bs, p = load_job_model(sm), sm.resources.batch_size, sm.params
    model, dataset = sm.wildcards.model, sm.wildcards.dataset
    kept, dropped = locate_spans(lm, p.chat, dataset, table, p.extractor, bs, p.extractor_template_kwargs)
    print(f"{model}/{dataset}: {kept.height} samples kept, {dropped.height} dropped", flush=True)
    if dropped.height:
        print(dropped.group_by("reason").len(), flush=True)
    knockout, desc = sm.params.knockout, f"knockout {model}/{dataset}"
    shapes = activations.resid_shapes(
        kept.height, lm.info["n_layers"], lm.info["hidden_size"], knockout["control_draws"]
    )
    with activations.written(sm.output, shapes, lm.model.dtype) as resid:
        out = activations.knockout_out(*resid)
        samples, scores = knockout_states(lm, kept, bs, knockout, p.saliency_batch_size, desc, out)
    samples.write_parquet(sm.output.samples)
    scores.write_parquet(sm.output.saliency)
    dropped.with_columns(model=pl.lit(model), dataset=pl.lit(dataset)).write_parquet(sm.output.dropped)


runlog.run(snakemake, main)  # noqa: F821
