import json
from pathlib import Path

from truthflow import runlog
from truthflow.data import load_depthqa, resolve_source


def main(sm):
    spec, record = resolve_source("depthqa", sm.params.spec)
    Path(sm.output.source).write_text(json.dumps(record, indent=2))
    questions, nodes, report = load_depthqa(spec)
    report.pop("dropped").write_parquet(sm.output.dropped)
    print(f"depthqa: {report}", flush=True)
    questions.write_parquet(sm.output.questions)
    nodes.write_parquet(sm.output.nodes)


runlog.run(snakemake, main)  # noqa: F821
