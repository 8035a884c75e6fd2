rule download_dataset:
    input:
        local=lambda w: local_source(w.dataset),
    output:
        data=res("data", "{dataset}.parquet"),
        # rows dropped from the source (duplicate_id, no_question, no_gold_answer) and n_exceeds_rows
        dropped=res("data", "{dataset}.dropped.parquet"),
    log:
        res("logs", "download_dataset", "{dataset}.log"),
    priority: PRIORITY["step"]
    localrule: True
    params:
        spec=lambda w: config["datasets"][w.dataset],
    script:
        "../scripts/download_dataset.py"


rule download_depthqa:
    input:
        local=lambda w: local_source("depthqa"),
    output:
        questions=res("data", "depthqa.parquet"),
        nodes=res("data", "depthqa_nodes.parquet"),
        dropped=res("data", "depthqa.dropped.parquet"),
    log:
        res("logs", "download_dataset", "depthqa.log"),
    priority: PRIORITY["step"]
    localrule: True
    params:
        spec=config["datasets"].get("depthqa"),
    script:
        "../scripts/download_depthqa.py"
