rule extract_pathways:
    input:
        labels=rules.label_answers.output.labels,
        data=rules.download_dataset.output.data,
        model=model_dir,
        code=code_inputs("extract_pathways.py"),
    output:
        samples=pw_dir("samples.parquet"),
        dropped=pw_dir("dropped.parquet"),
        resid_clean=state_file(pw_dir("resid_clean.npy")),
        resid_ko=state_file(pw_dir("resid_ko.npy")),
        resid_control=state_file(pw_dir("resid_control.npy")),
        saliency=pw_dir("saliency.parquet"),
        peaks=results_path("benchmarks", "extract_pathways", "{model}", "{dataset}.peaks.tsv"),
    log:
        results_path("logs", "extract_pathways", "{model}", "{dataset}.log"),
    benchmark:
        results_path("benchmarks", "extract_pathways", "{model}", "{dataset}.tsv")
    priority: PRIORITY["knockout"]
    threads: MODEL_THREADS
    resources:
        **model_resources("extract_pathways"),
        gpu=model_gpus,
    params:
        **model_params("chat", "dtype", "attention"),
        extractor=config["pathways"]["exact_tokens"]["extractor"],
        # the chat-template variables only reach the LLM extractor's prompts: a param only when it is used
        extractor_template_kwargs=lambda w: (
            model_spec(w.model)["chat_template_kwargs"]
            if config["pathways"]["exact_tokens"]["extractor"] == "llm"
            else None
        ),
        knockout=config["pathways"]["knockout"],
        # saliency runs here (its scores; resid_clean comes from the knockouts' pass); the rest wait for K
        saliency_batch_size=config["pathways"]["experiments"]["saliency_batch_size"],
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/extract_pathways.py"


rule probe_deltap:
    input:
        samples=rules.extract_pathways.output.samples,
        resid_clean=rules.extract_pathways.output.resid_clean,
        resid_ko=rules.extract_pathways.output.resid_ko,
        resid_control=rules.extract_pathways.output.resid_control,
        code=code_inputs("probe_deltap.py"),
    output:
        auc=pw_dir("probe_auc.parquet"),
        deltap=pw_dir("deltap.parquet"),
        summary=pw_dir("summary.parquet"),
        check=pw_dir("check.parquet"),
        settings=pw_dir(READER_SETTINGS_FILE["probe_deltap"]),
        peaks=results_path("benchmarks", "probe_deltap", "{model}", "{dataset}.peaks.tsv"),
    log:
        results_path("logs", "probe_deltap", "{model}", "{dataset}.log"),
    benchmark:
        results_path("benchmarks", "probe_deltap", "{model}", "{dataset}.tsv")
    priority: PRIORITY["step"]
    threads: analysis_threads("probe_deltap")
    resources:
        runtime=request_runtime("probe_deltap"),
        mem_mb=request_mem_mb("probe_deltap"),
    params:
        cfg=READER_SETTINGS["probe_deltap"],
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/probe_deltap.py"


rule pathways_tables:
    input:
        summary=per_run(rules.probe_deltap.output.summary),
        auc=per_run(rules.probe_deltap.output.auc),
        dropped=per_run(rules.extract_pathways.output.dropped),
        samples=per_run(rules.extract_pathways.output.samples),
        check=per_run(rules.probe_deltap.output.check),
        data_dropped=expand(rules.download_dataset.output.dropped, dataset=config["pathways"]["datasets"]),
        code=code_inputs("pathways_tables.py"),
    output:
        summary=results_path("tables", "pathways_summary.parquet"),
        check=results_path("tables", "pathways_check.parquet"),
        check_tsv=results_path("tables", "pathways_check.tsv"),
        check_layers=results_path("tables", "pathways_check_layers.tsv"),
        exact_tokens=results_path("tables", "exact_tokens.tsv"),
        auc=results_path("tables", "probe_auc.parquet"),
        auc_tsv=results_path("tables", "probe_auc.tsv"),
        dropped=results_path("tables", "dropped_samples.tsv"),
    log:
        results_path("logs", "pathways_tables.log"),
    localrule: True
    params:
        runs=pw_runs(),
        check=config["pathways"]["check"],
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/pathways_tables.py"


PATHWAYS_FIGURES = ("pathways", "probe_auc", "pathways_control", "pathways_check")


rule plot_pathways:
    input:
        **captions(PATHWAYS_FIGURES),
        summary=results_path("tables", "pathways_summary.parquet"),
        auc=results_path("tables", "probe_auc.parquet"),
        check=results_path("tables", "pathways_check.parquet"),
        code=code_inputs("plot_pathways.py"),
    output:
        **figures("Pathways", PATHWAYS_FIGURES, "_{pair}"),
    log:
        results_path("logs", "plot_pathways", "{pair}.log"),
    localrule: True
    params:
        models=lambda w: pair_models(w.pair),
        titles=lambda w: display_names(pair_models(w.pair)),
        caption=pathways_caption,
        show_caption=config["figures"]["caption"],
        target=config["pathways"]["knockout"]["target"],
        check=config["pathways"]["check"],
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/plot_pathways.py"


# ---------------------------------------------------------------- Section 3.2-5 experiments (A12-A17)
rule extract_experiments:
    input:
        samples=rules.extract_pathways.output.samples,
        saliency=rules.extract_pathways.output.saliency,
        labels=rules.label_answers.output.labels,
        data=rules.download_dataset.output.data,
        auc=rules.probe_deltap.output.auc,
        model=model_dir,
        code=code_inputs("extract_experiments.py"),
    output:
        patch=pw_dir("exp_patch.npy"),
        answer_only=pw_dir("exp_answer_only.npy"),
        pr=pw_dir("exp_pr.npy"),
        scores=pw_dir("exp_scores.parquet"),
        peaks=results_path("benchmarks", "extract_experiments", "{model}", "{dataset}.peaks.tsv"),
    log:
        results_path("logs", "extract_experiments", "{model}", "{dataset}.log"),
    benchmark:
        results_path("benchmarks", "extract_experiments", "{model}", "{dataset}.tsv")
    priority: PRIORITY["experiments"]
    threads: MODEL_THREADS
    resources:
        **model_resources("extract_experiments"),
        gpu=model_gpus,
    params:
        **model_params("chat", "dtype", "attention", "chat_template_kwargs"),
        experiments=config["pathways"]["experiments"],
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/extract_experiments.py"


rule pathway_experiments:
    input:
        **dict(rules.extract_experiments.output.items()),
        samples=rules.extract_pathways.output.samples,
        deltap=rules.probe_deltap.output.deltap,
        resid_clean=rules.extract_pathways.output.resid_clean,
        data=rules.download_dataset.output.data,
        code=code_inputs("pathway_experiments.py"),
    output:
        rows=pw_dir("exp_rows.parquet"),
        awareness=pw_dir("exp_awareness.parquet"),
        detection=pw_dir("exp_detection.parquet"),
        per_sample=pw_dir("exp_samples.parquet"),
        settings=pw_dir(READER_SETTINGS_FILE["pathway_experiments"]),
        peaks=results_path("benchmarks", "pathway_experiments", "{model}", "{dataset}.peaks.tsv"),
    log:
        results_path("logs", "pathway_experiments", "{model}", "{dataset}.log"),
    benchmark:
        results_path("benchmarks", "pathway_experiments", "{model}", "{dataset}.tsv")
    priority: PRIORITY["step"]
    threads: analysis_threads("pathway_experiments")
    resources:
        runtime=request_runtime("pathway_experiments"),
        mem_mb=request_mem_mb("pathway_experiments"),
    params:
        **READER_SETTINGS["pathway_experiments"],
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/pathway_experiments.py"


rule experiment_tables:
    input:
        **{k: per_run(path) for k, path in rules.pathway_experiments.output.items() if k != "peaks"},
        code=code_inputs("experiment_tables.py"),
    output:
        rows=results_path("tables", "pathways_experiments.parquet"),
        rows_tsv=results_path("tables", "pathways_experiments.tsv"),
        awareness=results_path("tables", "pathways_awareness.parquet"),
        awareness_tsv=results_path("tables", "pathways_awareness.tsv"),
        detection=results_path("tables", "pathways_detection.parquet"),
        table3=results_path("tables", "pathways_table3.tsv"),
        per_sample=results_path("tables", "pathways_experiment_samples.parquet"),
    log:
        results_path("logs", "experiment_tables.log"),
    localrule: True
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/experiment_tables.py"


EXPERIMENT_FIGURES = [
    f"experiment_{e}" for e in ("patching", "answer_only", "boundary", "saliency", "awareness")
]


rule plot_experiments:
    input:
        **captions(EXPERIMENT_FIGURES),
        rows=results_path("tables", "pathways_experiments.parquet"),
        awareness=results_path("tables", "pathways_awareness.parquet"),
        per_sample=results_path("tables", "pathways_experiment_samples.parquet"),
        published=checkout_path("workflow", "report", "published.tsv"),
        code=code_inputs("plot_experiments.py"),
    output:
        **figures("Pathways experiments", EXPERIMENT_FIGURES, "_{pair}"),
    log:
        results_path("logs", "plot_experiments", "{pair}.log"),
    localrule: True
    params:
        models=lambda w: pair_models(w.pair),
        titles=lambda w: display_names(pair_models(w.pair)),
        show_caption=config["figures"]["caption"],
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/plot_experiments.py"
