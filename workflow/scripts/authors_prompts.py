from truthflow import runlog
from truthflow.depth.authors import make_prompt_files


def main(sm):
    make_prompt_files(sm.params.url, sm.params.sha256, sm.output.source, sm.output.answer, sm.output.judge)
    print(f"the authors' prompts from {sm.params.url} -> {sm.output.answer}, {sm.output.judge}", flush=True)


runlog.run(snakemake, main)  # noqa: F821
