rule extract_pathways:
    input:
        labels=rules.label_answers.output.labels,
        data=rules.download_dataset.output.data,
        model=model_dir,
    output:
        samples=pw_dir("samples.parquet"),
        dropped=pw_dir("dropped.parquet"),
        resid_clean=pw_dir("resid_clean.npy"),
        resid_ko=pw_dir("resid_ko.npy"),
        resid_control=pw_dir("resid_control.npy"),
        saliency=pw_dir("saliency.parquet"),
    log:
        res("logs", "extract_pathways", "{model}", "{dataset}.log"),
    benchmark:
        res("benchmarks", "extract_pathways", "{model}", "{dataset}.tsv")
    priority: PRIORITY["knockout"]
    threads: MODEL_THREADS
    resources:
        **MODEL_RESOURCES,
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
        # saliency runs here (its clean pass gives resid_clean); the rest of the experiments wait for K
        saliency_batch_size=config["pathways"]["experiments"]["saliency_batch_size"],
    script:
        "../scripts/extract_pathways.py"


rule probe_deltap:
    input:
        samples=rules.extract_pathways.output.samples,
        resid_clean=rules.extract_pathways.output.resid_clean,
        resid_ko=rules.extract_pathways.output.resid_ko,
        resid_control=rules.extract_pathways.output.resid_control,
    output:
        auc=pw_dir("probe_auc.parquet"),
        deltap=pw_dir("deltap.parquet"),
        summary=pw_dir("summary.parquet"),
        check=pw_dir("check.parquet"),
    log:
        res("logs", "probe_deltap", "{model}", "{dataset}.log"),
    priority: PRIORITY["step"]
    params:
        cfg={
            k: config["pathways"][k]
            for k in ("probe", "anchor_split", "fixed_layer", "bootstrap", "check")
        },
    script:
        "../scripts/probe_deltap.py"


rule pathways_tables:
    input:
        summary=per_pair(rules.probe_deltap.output.summary),
        auc=per_pair(rules.probe_deltap.output.auc),
        dropped=per_pair(rules.extract_pathways.output.dropped),
        samples=per_pair(rules.extract_pathways.output.samples),
        check=per_pair(rules.probe_deltap.output.check),
        data_dropped=expand(
            rules.download_dataset.output.dropped,
            dataset=config["pathways"]["datasets"],
        ),
    output:
        summary=res("tables", "pathways_summary.parquet"),
        check=res("tables", "pathways_check.parquet"),
        check_tsv=res("tables", "pathways_check.tsv"),
        check_layers=res("tables", "pathways_check_layers.tsv"),
        exact_tokens=res("tables", "exact_tokens.tsv"),
        auc=res("tables", "probe_auc.parquet"),
        auc_tsv=res("tables", "probe_auc.tsv"),
        dropped=res("tables", "dropped_samples.tsv"),
    log:
        res("logs", "pathways_tables.log"),
    localrule: True
    params:
        pairs=pw_pairs(),
        check=config["pathways"]["check"],
    script:
        "../scripts/pathways_tables.py"


rule plot_pathways:
    input:
        summary=res("tables", "pathways_summary.parquet"),
        auc=res("tables", "probe_auc.parquet"),
        check=res("tables", "pathways_check.parquet"),
        captions=caption_files("pathways", "probe_auc", "pathways_control", "pathways_check"),
    output:
        png=report(
            res("figures", "pathways_{pair}.png"),
            category="Pathways",
            caption="../report/pathways.rst",
        ),
        pdf=res("figures", "pathways_{pair}.pdf"),
        auc_png=report(
            res("figures", "probe_auc_{pair}.png"),
            category="Pathways",
            caption="../report/probe_auc.rst",
        ),
        auc_pdf=res("figures", "probe_auc_{pair}.pdf"),
        control_png=report(
            res("figures", "pathways_control_{pair}.png"),
            category="Pathways",
            caption="../report/pathways_control.rst",
        ),
        control_pdf=res("figures", "pathways_control_{pair}.pdf"),
        check_png=report(
            res("figures", "pathways_check_{pair}.png"),
            category="Pathways",
            caption="../report/pathways_check.rst",
        ),
        check_pdf=res("figures", "pathways_check_{pair}.pdf"),
    log:
        res("logs", "plot_pathways", "{pair}.log"),
    localrule: True
    params:
        models=lambda w: pair_models(w.pair),
        titles=lambda w: {
            m: model_spec(m).get("display_name", m) for m in pair_models(w.pair)
        },
        caption=pathways_caption,
        show_caption=config["figures"]["caption"],
        target=config["pathways"]["knockout"]["target"],
        check=config["pathways"]["check"],
        report=checkout_path("workflow", "report"),
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
    output:
        patch=pw_dir("exp_patch.npy"),
        answer_only=pw_dir("exp_answer_only.npy"),
        pr=pw_dir("exp_pr.npy"),
        scores=pw_dir("exp_scores.parquet"),
    log:
        res("logs", "extract_experiments", "{model}", "{dataset}.log"),
    benchmark:
        res("benchmarks", "extract_experiments", "{model}", "{dataset}.tsv")
    priority: PRIORITY["experiments"]
    threads: MODEL_THREADS
    resources:
        **MODEL_RESOURCES,
        gpu=model_gpus,
    params:
        **model_params("chat", "dtype", "attention", "chat_template_kwargs"),
        experiments=config["pathways"]["experiments"],
    script:
        "../scripts/extract_experiments.py"


rule pathway_experiments:
    input:
        **dict(rules.extract_experiments.output.items()),
        samples=rules.extract_pathways.output.samples,
        deltap=rules.probe_deltap.output.deltap,
        resid_clean=rules.extract_pathways.output.resid_clean,
        data=rules.download_dataset.output.data,
    output:
        rows=pw_dir("exp_rows.parquet"),
        awareness=pw_dir("exp_awareness.parquet"),
        detection=pw_dir("exp_detection.parquet"),
        per_sample=pw_dir("exp_samples.parquet"),
    log:
        res("logs", "pathway_experiments", "{model}", "{dataset}.log"),
    priority: PRIORITY["step"]
    params:
        experiments=config["pathways"]["experiments"],
        probe=config["pathways"]["probe"],
        bootstrap=config["pathways"]["bootstrap"],
    script:
        "../scripts/pathway_experiments.py"


rule experiment_tables:
    input:
        **{k: per_pair(path) for k, path in rules.pathway_experiments.output.items()},
    output:
        rows=res("tables", "pathways_experiments.parquet"),
        rows_tsv=res("tables", "pathways_experiments.tsv"),
        awareness=res("tables", "pathways_awareness.parquet"),
        awareness_tsv=res("tables", "pathways_awareness.tsv"),
        detection=res("tables", "pathways_detection.parquet"),
        table3=res("tables", "pathways_table3.tsv"),
        per_sample=res("tables", "pathways_experiment_samples.parquet"),
    log:
        res("logs", "experiment_tables.log"),
    localrule: True
    script:
        "../scripts/experiment_tables.py"


rule plot_experiments:
    input:
        rows=res("tables", "pathways_experiments.parquet"),
        awareness=res("tables", "pathways_awareness.parquet"),
        per_sample=res("tables", "pathways_experiment_samples.parquet"),
        published=checkout_path("workflow", "report", "published.tsv"),
        captions=caption_files(
            *(f"pathways_{f}" for f in ("patching", "answer_only", "boundary", "saliency", "awareness"))
        ),
    output:
        patching_png=report(
            res("figures", "experiment_patching_{pair}.png"),
            category="Pathways experiments",
            caption="../report/pathways_patching.rst",
        ),
        patching_pdf=res("figures", "experiment_patching_{pair}.pdf"),
        answer_only_png=report(
            res("figures", "experiment_answer_only_{pair}.png"),
            category="Pathways experiments",
            caption="../report/pathways_answer_only.rst",
        ),
        answer_only_pdf=res("figures", "experiment_answer_only_{pair}.pdf"),
        boundary_png=report(
            res("figures", "experiment_boundary_{pair}.png"),
            category="Pathways experiments",
            caption="../report/pathways_boundary.rst",
        ),
        boundary_pdf=res("figures", "experiment_boundary_{pair}.pdf"),
        saliency_png=report(
            res("figures", "experiment_saliency_{pair}.png"),
            category="Pathways experiments",
            caption="../report/pathways_saliency.rst",
        ),
        saliency_pdf=res("figures", "experiment_saliency_{pair}.pdf"),
        awareness_png=report(
            res("figures", "experiment_awareness_{pair}.png"),
            category="Pathways experiments",
            caption="../report/pathways_awareness.rst",
        ),
        awareness_pdf=res("figures", "experiment_awareness_{pair}.pdf"),
    log:
        res("logs", "plot_experiments", "{pair}.log"),
    localrule: True
    params:
        models=lambda w: pair_models(w.pair),
        titles=lambda w: {
            m: model_spec(m).get("display_name", m) for m in pair_models(w.pair)
        },
        show_caption=config["figures"]["caption"],
        report=checkout_path("workflow", "report"),
    script:
        "../scripts/plot_experiments.py"
