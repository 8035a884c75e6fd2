import json
from pathlib import Path

from truthflow import runlog
from truthflow.data import load_qa, resolve_source


def main(sm):
    spec, record = resolve_source(sm.wildcards.dataset, sm.params.spec)
    Path(sm.output.source).write_text(json.dumps(record, indent=2))
    df, report = load_qa(sm.wildcards.dataset, spec)
    report.pop("dropped").write_parquet(sm.output.dropped)
    print(f"{sm.wildcards.dataset}: {report}", flush=True)
    df.write_parquet(sm.output.data)


runlog.run(snakemake, main)  # noqa: F821
