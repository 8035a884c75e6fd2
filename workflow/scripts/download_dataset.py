from truthflow import runlog
from truthflow.data import load_qa


def main(sm):
    df, report = load_qa(sm.wildcards.dataset, sm.params.spec)
    dropped = report.pop("dropped")
    print(f"{sm.wildcards.dataset}: {report}", flush=True)
    runlog.write_parquet(df, sm.output.data)
    runlog.write_parquet(dropped, sm.output.dropped)


runlog.run(snakemake, main)  # noqa: F821
