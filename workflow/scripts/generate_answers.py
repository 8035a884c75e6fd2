import polars as pl

from truthflow import jobs, runlog, validate


def main(sm):
    questions = validate.read_parquet(sm.input.data, ["id", "question"])
    desc = f"generate {sm.wildcards.model}/{sm.wildcards.dataset}"
    ids, dataset = questions["id"].to_list(), sm.wildcards.dataset
    answers, writer = jobs.answer_table(
        sm, questions["question"].to_list(), sm.params.instruction, desc, ids=ids, dataset=dataset
    )
    table = pl.concat([questions.select("id"), answers], how="horizontal")
    jobs.write_answers(table, sm.output[0], writer, f"{sm.wildcards.model}/{dataset}")


# vLLM spawns its engine process, which imports this file again: only the job itself runs main
if __name__ == "__main__":
    runlog.run(snakemake, main)  # noqa: F821
