from truthflow import runlog
from truthflow.data import load_qa


def main(sm):
    df, report = load_qa(sm.wildcards.dataset, sm.params.spec)
    report.pop("dropped").write_parquet(sm.output.dropped)
    print(f"{sm.wildcards.dataset}: {report}", flush=True)
    df.write_parquet(sm.output.data)


runlog.run(snakemake, main)  # noqa: F821
