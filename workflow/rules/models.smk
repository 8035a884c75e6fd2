from truthflow.models import weights_key


# resources/models/<name> (a link to resources/models/.prepared/<name>-<key digest>) depends only on what
# changes the weights: never on display_name, chat, batch_size, gpus..., nor on the package's code
rule prepare_model:
    output:
        directory("resources/models/{model}"),
    log:
        "resources/logs/prepare_model/{model}.log",
    localrule: True
    params:
        key=lambda w: weights_key(model_spec(w.model)),
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/prepare_model.py"
