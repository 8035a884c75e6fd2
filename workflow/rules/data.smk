rule download_dataset:
    input:
        local=lambda w: local_source("datasets", w.dataset),
        code=code("data"),
    output:
        res("data", "{dataset}.parquet"),
    log:
        res("logs", "download_dataset", "{dataset}.log"),
    retries: 2
    localrule: True
    conda:
        "../../envs/truthflow.yaml"
    params:
        spec=lambda w: config["datasets"][w.dataset],
    script:
        "../scripts/download_dataset.py"


rule download_depthqa:
    input:
        local=lambda w: local_source("datasets", "depthqa"),
        code=code("data"),
    output:
        questions=res("data", "depthqa.parquet"),
        nodes=res("data", "depthqa_nodes.parquet"),
    log:
        res("logs", "download_dataset", "depthqa.log"),
    retries: 2
    localrule: True
    conda:
        "../../envs/truthflow.yaml"
    params:
        spec=config["datasets"].get("depthqa"),
    script:
        "../scripts/download_depthqa.py"
