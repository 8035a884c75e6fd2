from truthflow import runlog
from truthflow.data import load_depthqa


def main(sm):
    questions, nodes, report = load_depthqa(sm.params.spec)
    dropped = report.pop("dropped")
    print(f"depthqa: {report}", flush=True)
    questions.write_parquet(sm.output.questions)
    nodes.write_parquet(sm.output.nodes)
    dropped.write_parquet(sm.output.dropped)


runlog.run(snakemake, main)  # noqa: F821
