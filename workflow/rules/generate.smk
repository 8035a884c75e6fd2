rule generate_answers:
    input:
        data=rules.download_dataset.output.data,
        model=model_dir,
        code=code_inputs("generate_answers.py"),
    output:
        results_path("answers", "{model}", "{dataset}.parquet"),
        peaks=results_path("benchmarks", "generate_answers", "{model}", "{dataset}.peaks.tsv"),
    log:
        results_path("logs", "generate_answers", "{model}", "{dataset}.log"),
    benchmark:
        results_path("benchmarks", "generate_answers", "{model}", "{dataset}.tsv")
    priority: PRIORITY["answers"]
    threads: MODEL_THREADS
    resources:
        **model_resources("generate_answers"),
        gpu=model_gpus,
    params:
        **model_params("chat", "dtype", "attention", "max_new_tokens", "token_budget", "chat_template_kwargs"),
        instruction=config["generation"]["instruction"],
        backend=answer_backend_param,
        max_prompt_tokens=config["generation"]["max_prompt_tokens"],
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/generate_answers.py"


rule label_answers:
    input:
        answers=rules.generate_answers.output[0],
        data=rules.download_dataset.output.data,
        code=code_inputs("label_answers.py"),
    output:
        labels=results_path("labels", "{model}", "{dataset}.parquet"),
        accuracy=results_path("labels", "{model}", "{dataset}.accuracy.tsv"),
    log:
        results_path("logs", "label_answers", "{model}", "{dataset}.log"),
    priority: PRIORITY["step"]
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/label_answers.py"


rule accuracy_table:
    input:
        tables=per_run(rules.label_answers.output.accuracy, qa_runs()),
        code=code_inputs("concat_tables.py"),
    output:
        results_path("tables", "accuracy.tsv"),
    log:
        results_path("logs", "accuracy_table.log"),
    localrule: True
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/concat_tables.py"
