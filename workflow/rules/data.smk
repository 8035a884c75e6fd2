rule download_dataset:
    input:
        local=lambda w: local_source(w.dataset),
        code=code_inputs("download_dataset.py"),
    output:
        data=results_path("data", "{dataset}.parquet"),
        # rows dropped from the source (duplicate_id, no_question, no_gold_answer) and n_exceeds_rows
        dropped=results_path("data", "{dataset}.dropped.parquet"),
        # the source as resolved: its revision (a hub source's commit) and files' sha256 (inputs table)
        source=results_path("data", "{dataset}.source.json"),
    log:
        results_path("logs", "download_dataset", "{dataset}.log"),
    priority: PRIORITY["step"]
    localrule: True
    params:
        spec=lambda w: config["datasets"][w.dataset],
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/download_dataset.py"


rule download_depthqa:
    input:
        local=lambda w: local_source("depthqa"),
        code=code_inputs("download_depthqa.py"),
    output:
        questions=results_path("data", "depthqa.parquet"),
        nodes=results_path("data", "depthqa_nodes.parquet"),
        dropped=results_path("data", "depthqa.dropped.parquet"),
        source=results_path("data", "depthqa.source.json"),
    log:
        results_path("logs", "download_dataset", "depthqa.log"),
    priority: PRIORITY["step"]
    localrule: True
    params:
        spec=config["datasets"].get("depthqa"),
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/download_depthqa.py"


# every model's and dataset's resolved revision and files' sha256, and the pinned files (the report's table)
rule input_revisions:
    input:
        models=[model_dir(model=m) for m in used_models()],
        datasets=[results_path("data", f"{d}.source.json") for d in used_datasets()],
        # depth.smk defines the rule, after this file
        released=lambda w: expand(rules.released_answers.output.released, model=RELEASED),
        # each generated answers table names what wrote it (vLLM or the engine) in its metadata
        answers=lambda w: generated_answers(),
        code=code_inputs("input_revisions.py"),
    output:
        results_path("tables", "inputs.tsv"),
    log:
        results_path("logs", "input_revisions.log"),
    localrule: True
    params:
        specs={m: model_spec(m)["source"] for m in used_models()},
        released_files=config["depth"]["released_answers"],
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/input_revisions.py"
