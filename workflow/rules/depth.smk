rule score_mink:
    input:
        data=rules.download_depthqa.output.questions,
        model=model_dir,
        code=code_inputs("score_mink.py"),
    output:
        depth_dir("mink.parquet"),
        peaks=results_path("benchmarks", "score_mink", "{model}.peaks.tsv"),
    log:
        results_path("logs", "score_mink", "{model}.log"),
    benchmark:
        results_path("benchmarks", "score_mink", "{model}.tsv")
    priority: PRIORITY["answers"]
    threads: MODEL_THREADS
    resources:
        **model_resources("score_mink"),
        gpu=model_gpus,
    params:
        **model_params("dtype", "attention"),
        k_grid=config["depth"]["mink"]["k_grid"],
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/score_mink.py"


rule answer_depthqa:
    input:
        data=rules.download_depthqa.output.questions,
        model=model_dir,
        prompt=prompt_file(config["depth"]["prompt"], "depth.prompt"),
        code=code_inputs("answer_depthqa.py"),
    output:
        depth_dir("answers.parquet"),
        peaks=results_path("benchmarks", "answer_depthqa", "{model}.peaks.tsv"),
    log:
        results_path("logs", "answer_depthqa", "{model}.log"),
    benchmark:
        results_path("benchmarks", "answer_depthqa", "{model}.tsv")
    priority: PRIORITY["answers"]
    threads: MODEL_THREADS
    resources:
        **model_resources("answer_depthqa"),
        gpu=model_gpus,
    params:
        **model_params("chat", "dtype", "attention", "token_budget", "chat_template_kwargs"),
        max_new_tokens=config["depth"]["max_new_tokens"],
        max_prompt_tokens=config["generation"]["max_prompt_tokens"],
        decoding=config["depth"]["decoding"],
        prompt_layout=config["depth"]["prompt_layout"],
        backend=answer_backend_param,
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/answer_depthqa.py"


rule authors_prompts:
    input:
        code=code_inputs("authors_prompts.py"),
    output:
        source="resources/depthqa_authors/prompts.py",
        answer=str(authors.PROMPT_FILES["answer"]),
        judge=str(authors.PROMPT_FILES["judge"]),
    log:
        "resources/logs/authors_prompts.log",
    localrule: True
    params:
        url=authors.PROMPTS_URL,
        sha256=authors.PROMPTS_SHA256,
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/authors_prompts.py"


# a model of depth.released_answers: its answers are read from the released file, not generated
rule released_answers:
    input:
        data=rules.download_depthqa.output.questions,
        code=code_inputs("released_answers.py"),
    output:
        released=depth_dir("released_answers.json"),
        answers=depth_dir("released_answers.parquet"),
        questions=depth_dir("released_questions.parquet"),
    log:
        results_path("logs", "released_answers", "{model}.log"),
    localrule: True
    params:
        released=lambda w: config["depth"]["released_answers"][w.model],
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/released_answers.py"


rule judge_answers:
    input:
        answers=depth_answers,
        data=judged_questions,
        # an hf judge named as a configured model's dir (resources/models/<name>) is prepared first
        judge_model=judge_model_input(),
        prompt=prompt_file(config["depth"]["judge"]["prompt"], "depth.judge.prompt"),
        code=code_inputs("judge_answers.py"),
    output:
        depth_dir("scores.parquet"),
    log:
        results_path("logs", "judge_answers", "{model}.log"),
    # an hf judge is a model job: it holds a GPU (devices.assign_devices, as the model jobs) and their threads
    threads: MODEL_THREADS if config["depth"]["judge"].get("backend") == "hf" else 1
    resources:
        gpu=1 if config["depth"]["judge"].get("backend") == "hf" else 0,
        runtime=request_runtime("judge_answers"),
        mem_mb=request_mem_mb("judge_answers"),
    params:
        judge=config["depth"]["judge"],
        # an hf judge's verdicts are written by vLLM or the engine, as the answers (generation.backend); an
        # openai or reference judge runs no model here
        generation_backend=(
            config["generation"]["backend"] if config["depth"]["judge"]["backend"] == "hf" else "engine"
        ),
        # verdicts are cached here, outside results/, so a rerun or a crash never pays twice
        cache="resources/judge_cache/{model}.jsonl",
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/judge_answers.py"


rule depth_tables:
    input:
        mink=expand(rules.score_mink.output[0], model=config["depth"]["models"]),
        scores=expand(rules.judge_answers.output[0], model=config["depth"]["models"]),
        nodes=rules.download_depthqa.output.nodes,
        answer_prompt=rules.answer_depthqa.input.prompt,
        judge_prompt=rules.judge_answers.input.prompt,
        code=code_inputs("depth_tables.py"),
    output:
        per_question=results_path("tables", "depth_per_question.parquet"),
        depthwise=results_path("tables", "depth_depthwise.parquet"),
        gaps=results_path("tables", "depth_score_gaps.parquet"),
        subsets=results_path("tables", "depth_memorization_subsets.parquet"),
        pooled=results_path("tables", "depth_pooled_by_depth.tsv"),
        metrics=results_path("tables", "depth_metrics.parquet"),
        metrics_tsv=results_path("tables", "depth_metrics.tsv"),
        prompts=results_path("tables", "depth_prompts.tsv"),
    log:
        results_path("logs", "depth_tables.log"),
    localrule: True
    params:
        k_plot=config["depth"]["mink"]["k_plot"],
        memorization=config["depth"]["memorization"],
        metrics=config["depth"]["metrics"],
        judge_backend=config["depth"]["judge"]["backend"],
        prompt_keys={"answer": "depth.prompt", "judge": "depth.judge.prompt"},
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/depth_tables.py"


# the judge stage alone, over the released answers: the authors' metrics and the judge prompt's digest
rule released_metrics:
    input:
        scores=expand(rules.judge_answers.output[0], model=RELEASED),
        nodes=rules.download_depthqa.output.nodes,
        judge_prompt=rules.judge_answers.input.prompt,
        code=code_inputs("released_metrics.py"),
    output:
        metrics=results_path("tables", "depth_released_metrics.parquet"),
        metrics_tsv=results_path("tables", "depth_released_metrics.tsv"),
        prompts=results_path("tables", "depth_released_prompts.tsv"),
    log:
        results_path("logs", "released_metrics.log"),
    localrule: True
    params:
        metrics=config["depth"]["metrics"],
        judge_backend=config["depth"]["judge"]["backend"],
        prompt_key="depth.judge.prompt",
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/released_metrics.py"


DEPTH_FIGURES = ("depth_mink_boxes", "depth_score_gap_density")


rule plot_depth:
    input:
        **captions(DEPTH_FIGURES),
        depthwise=results_path("tables", "depth_depthwise.parquet"),
        subsets=results_path("tables", "depth_memorization_subsets.parquet"),
        code=code_inputs("plot_depth.py"),
    output:
        **figures("Depth", DEPTH_FIGURES),
    log:
        results_path("logs", "plot_depth.log"),
    localrule: True
    params:
        models=config["figures"]["depth"],
        titles=display_names(config["figures"]["depth"]),
        caption=depth_caption,
        show_caption=config["figures"]["caption"],
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/plot_depth.py"
