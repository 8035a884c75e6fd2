import polars as pl

from truthflow import runlog, validate
from truthflow.pathways.labels import accuracy_table, label_frame


def main(sm):
    questions = validate.read_parquet(sm.input.data, ["id", "question", "answers"])
    answers = validate.read_parquet(sm.input.answers, ["id", "answer"])
    validate.check_ids(answers, sm.input.answers, "id", questions["id"], sm.input.data)
    labelled = label_frame(answers, questions)
    acc = accuracy_table(labelled, sm.wildcards.model, sm.wildcards.dataset)
    print(acc, flush=True)
    echoes = labelled.filter(pl.col("echo_rejected")).join(questions.select("id", "question"), on="id")
    for r in echoes.head(5).iter_rows(named=True):  # the log shows what the echo rule rejected
        print(f"echo rejected: {r['question']!r} -> {r['answer']!r}", flush=True)
    labelled.write_parquet(sm.output.labels)
    acc.write_csv(sm.output.accuracy, separator="\t")


runlog.run(snakemake, main)  # noqa: F821
