from truthflow import runlog
from truthflow.data import load_qa


def main(sm):
    df, report = load_qa(sm.wildcards.dataset, sm.params.spec)
    print(f"{sm.wildcards.dataset}: {report}", flush=True)
    runlog.write_parquet(df, sm.output[0])


runlog.run(snakemake, main)  # noqa: F821
