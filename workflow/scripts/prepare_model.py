import time

from truthflow import runlog
from truthflow.models import prepare_model


def main(sm):
    t0 = time.perf_counter()
    info = prepare_model(sm.wildcards.model, sm.params.key, sm.output[0])
    print(f"{sm.wildcards.model}: {info} ({time.perf_counter() - t0:.1f} s)", flush=True)


runlog.run(snakemake, main)  # noqa: F821
