import polars as pl

from truthflow import jobs, runlog, validate
from truthflow.depth.prompts import load_answer_prompt, vllm_encode
from truthflow.engine import Decoding


def main(sm):
    questions = validate.read_parquet(sm.input.data, ["id", "question", "depth"])
    prompt, p = load_answer_prompt(sm.input.prompt), sm.params
    layout = p.prompt_layout
    answers, writer = jobs.answer_table(
        sm,
        questions["question"].to_list(),
        "",
        f"answer depthqa {sm.wildcards.model}",
        render=lambda tok, q: prompt.render(tok, q, p.chat, p.chat_template_kwargs, layout),
        encode=vllm_encode if layout == "authors" else None,
        # the authors passed text to vLLM, which tokenized it: vLLM gets the same text and tokenizes it again
        send_text=layout == "authors",
        keys=questions["id"].to_list(),
        decoding=Decoding.from_config(p.decoding),
        ids=questions["id"].to_list(),
        dataset="depthqa",
    )
    answers = answers.drop("prompt_ids", "answer_ids")
    out = pl.concat([questions.select(pl.col("id").alias("qid"), "depth"), answers], how="horizontal")
    jobs.write_answers(out, sm.output[0], writer, f"{sm.wildcards.model}/depthqa")


# vLLM spawns its engine process, which imports this file again: only the job itself runs main
if __name__ == "__main__":
    runlog.run(snakemake, main)  # noqa: F821
