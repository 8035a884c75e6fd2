from truthflow import runlog, validate
from truthflow.depth.authors import released_answers
from truthflow.hub import download_pinned


def main(sm):
    model, url = sm.wildcards.model, sm.params.released["url"]
    download_pinned(url, sm.params.released["sha256"], sm.output.released, f"released answers of '{model}'")
    data = validate.read_parquet(sm.input.data, ["id", "depth"])
    answers, questions = released_answers(sm.output.released, data)
    print(f"{model}: {answers.height} released answers from {url}", flush=True)
    answers.write_parquet(sm.output.answers)
    questions.write_parquet(sm.output.questions)


runlog.run(snakemake, main)  # noqa: F821
