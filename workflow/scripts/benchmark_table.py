from truthflow import runlog


def main(sm):
    table = runlog.benchmark_table(sm.input.tables, sm.input.peaks, sm.params.jobs)
    table.write_csv(sm.output[0], separator="\t")


runlog.run(snakemake, main)  # noqa: F821
