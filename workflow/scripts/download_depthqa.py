from truthflow import runlog
from truthflow.data import load_depthqa


def main(sm):
    questions, nodes, report = load_depthqa(sm.params.spec)
    report.pop("dropped").write_parquet(sm.output.dropped)
    print(f"depthqa: {report}", flush=True)
    questions.write_parquet(sm.output.questions)
    nodes.write_parquet(sm.output.nodes)


runlog.run(snakemake, main)  # noqa: F821
