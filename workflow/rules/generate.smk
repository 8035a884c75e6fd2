rule generate_answers:
    input:
        data=rules.download_dataset.output.data,
        model=model_dir,
    output:
        res("answers", "{model}", "{dataset}.parquet"),
    log:
        res("logs", "generate_answers", "{model}", "{dataset}.log"),
    benchmark:
        res("benchmarks", "generate_answers", "{model}", "{dataset}.tsv")
    priority: PRIORITY["answers"]
    threads: MODEL_THREADS
    resources:
        **MODEL_RESOURCES,
        gpu=model_gpus,
    params:
        **model_params(
            "chat", "dtype", "attention", "max_new_tokens", "token_budget", "chat_template_kwargs"
        ),
        instruction=config["generation"]["instruction"],
        max_prompt_tokens=config["generation"]["max_prompt_tokens"],
    script:
        "../scripts/generate_answers.py"


rule label_answers:
    input:
        answers=rules.generate_answers.output[0],
        data=rules.download_dataset.output.data,
    output:
        labels=res("labels", "{model}", "{dataset}.parquet"),
        accuracy=res("labels", "{model}", "{dataset}.accuracy.tsv"),
    log:
        res("logs", "label_answers", "{model}", "{dataset}.log"),
    priority: PRIORITY["step"]
    script:
        "../scripts/label_answers.py"


rule accuracy_table:
    input:
        tables=per_pair(rules.label_answers.output.accuracy, qa_pairs()),
    output:
        res("tables", "accuracy.tsv"),
    log:
        res("logs", "accuracy_table.log"),
    localrule: True
    script:
        "../scripts/concat_tables.py"
