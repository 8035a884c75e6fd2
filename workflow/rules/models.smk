rule prepare_model:
    output:
        directory("resources/models/{model}"),
    log:
        "resources/logs/prepare_model/{model}.log",
    localrule: True
    conda:
        "../../envs/truthflow.yaml"
    params:
        spec=lambda w: {
            k: model_spec(w.model)[k]
            for k in ("source", "dtype", "chat", "display_name")
            if k in model_spec(w.model)
        },
        # bump when the conversion itself changes (not an input, so editing model loading keeps the cache)
        converter_version=1,
    script:
        "../scripts/prepare_model.py"
