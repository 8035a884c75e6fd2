from truthflow.models import weights_key


# resources/models/<name> (a link to resources/models/.prepared/<name>-<key digest>) depends only on what
# changes the weights: display_name, chat, batch_size, max_new_tokens, gpus... never rebuild it, and neither
# does editing the package (common.smk gives it no code input: its conversion is keyed by PREPARE_VERSION)
rule prepare_model:
    output:
        directory("resources/models/{model}"),
    log:
        "resources/logs/prepare_model/{model}.log",
    localrule: True
    params:
        key=lambda w: weights_key(model_spec(w.model)),
    script:
        "../scripts/prepare_model.py"
