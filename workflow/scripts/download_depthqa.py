from truthflow import runlog
from truthflow.data import load_depthqa


def main(sm):
    questions, nodes, report = load_depthqa(sm.params.spec)
    dropped = report.pop("dropped")
    print(f"depthqa: {report}", flush=True)
    runlog.write_parquet(questions, sm.output.questions)
    runlog.write_parquet(nodes, sm.output.nodes)
    runlog.write_parquet(dropped, sm.output.dropped)


runlog.run(snakemake, main)  # noqa: F821
