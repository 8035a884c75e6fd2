rule extract_pathways:
    input:
        labels=res("labels", "{model}", "{dataset}.parquet"),
        data=res("data", "{dataset}.parquet"),
        model=model_dir,
        code=code(),
    output:
        samples=pw_dir("samples.parquet"),
        dropped=pw_dir("dropped.parquet"),
        resid_clean=pw_dir("resid_clean.npy"),
        resid_ko=pw_dir("resid_ko.npy"),
        resid_control=pw_dir("resid_control.npy"),
    log:
        res("logs", "extract_pathways", "{model}", "{dataset}.log"),
    benchmark:
        res("benchmarks", "extract_pathways", "{model}", "{dataset}.tsv")
    conda:
        "../../envs/truthflow.yaml"
    threads: MODEL_THREADS
    resources:
        gpu=lambda w: gpu_resources(w.model)["gpu"],
        mem_mb=lambda w: gpu_resources(w.model)["mem_mb"],
        runtime=lambda w: gpu_resources(w.model)["runtime"],
        batch_size=lambda w: model_spec(w.model)["batch_size"],
    params:
        chat=lambda w: model_spec(w.model)["chat"],
        dtype=lambda w: model_spec(w.model)["dtype"],
        extractor=config["pathways"]["exact_tokens"]["extractor"],
        knockout=config["pathways"]["knockout"],
    script:
        "../scripts/extract_pathways.py"


rule probe_deltap:
    input:
        samples=pw_dir("samples.parquet"),
        resid_clean=pw_dir("resid_clean.npy"),
        resid_ko=pw_dir("resid_ko.npy"),
        resid_control=pw_dir("resid_control.npy"),
        code=code(),
    output:
        auc=pw_dir("probe_auc.parquet"),
        deltap=pw_dir("deltap.parquet"),
        summary=pw_dir("summary.parquet"),
        check=pw_dir("check.parquet"),
    log:
        res("logs", "probe_deltap", "{model}", "{dataset}.log"),
    conda:
        "../../envs/truthflow.yaml"
    params:
        cfg={
            k: config["pathways"][k]
            for k in ("probe", "anchor_split", "fixed_layer", "bootstrap", "check")
        },
    script:
        "../scripts/probe_deltap.py"


rule pathways_tables:
    input:
        summary=pw_inputs("summary.parquet"),
        auc=pw_inputs("probe_auc.parquet"),
        dropped=pw_inputs("dropped.parquet"),
        samples=pw_inputs("samples.parquet"),
        check=pw_inputs("check.parquet"),
        data_dropped=[
            res("data", f"{d}.dropped.parquet") for d in config["pathways"]["datasets"]
        ],
        code=code(),
    output:
        summary=res("tables", "pathways_summary.parquet"),
        check=res("tables", "pathways_check.parquet"),
        check_tsv=res("tables", "pathways_check.tsv"),
        exact_tokens=res("tables", "exact_tokens.tsv"),
        auc=res("tables", "probe_auc.parquet"),
        auc_tsv=res("tables", "probe_auc.tsv"),
        dropped=res("tables", "dropped_samples.tsv"),
    log:
        res("logs", "pathways_tables.log"),
    localrule: True
    conda:
        "../../envs/truthflow.yaml"
    params:
        pairs=pw_pairs(),
    script:
        "../scripts/pathways_tables.py"


rule plot_pathways:
    input:
        summary=res("tables", "pathways_summary.parquet"),
        auc=res("tables", "probe_auc.parquet"),
        check=res("tables", "pathways_check.parquet"),
        code=code(),
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
    conda:
        "../../envs/truthflow.yaml"
    params:
        models=lambda w: pair_models(w.pair),
        titles=lambda w: {
            m: model_spec(m).get("display_name", m) for m in pair_models(w.pair)
        },
        caption=pathways_caption,
        show_caption=config["figures"]["caption"],
        target=config["pathways"]["knockout"]["target"],
    script:
        "../scripts/plot_pathways.py"
