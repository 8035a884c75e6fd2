rule download_dataset:
    input:
        local=lambda w: local_source(w.dataset),
        code=code_inputs("download_dataset.py"),
    output:
        data=results_path("data", "{dataset}.parquet"),
        # rows dropped from the source (duplicate_id, no_question, no_gold_answer) and n_exceeds_rows
        dropped=results_path("data", "{dataset}.dropped.parquet"),
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
