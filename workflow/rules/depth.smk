DEPTH = config["depth"]


def depth_dir(*parts):
    return res("depth", "{model}", *parts)


rule score_mink:
    input:
        data=res("data", "depthqa.parquet"),
        model=model_dir,
        code=code("mink", "models", "batching"),
    output:
        depth_dir("mink.parquet"),
    params:
        dtype=lambda w: model_spec(w.model)["dtype"],
        k_grid=DEPTH["mink"]["k_grid"],
    threads: MODEL_THREADS
    resources:
        gpu=lambda w: gpu_resources(w.model)["gpu"],
        mem_mb=lambda w: gpu_resources(w.model)["mem_mb"],
        runtime=lambda w: gpu_resources(w.model)["runtime"],
        batch_size=lambda w: model_spec(w.model)["batch_size"],
    log:
        res("logs", "score_mink", "{model}.log"),
    benchmark:
        res("benchmarks", "score_mink", "{model}.tsv")
    script:
        "../scripts/score_mink.py"


rule answer_depthqa:
    input:
        data=res("data", "depthqa.parquet"),
        model=model_dir,
        code=code("generation", "models", "batching"),
    output:
        depth_dir("answers.parquet"),
    params:
        chat=lambda w: model_spec(w.model)["chat"],
        dtype=lambda w: model_spec(w.model)["dtype"],
        max_new_tokens=DEPTH["max_new_tokens"],
    threads: MODEL_THREADS
    resources:
        gpu=lambda w: gpu_resources(w.model)["gpu"],
        mem_mb=lambda w: gpu_resources(w.model)["mem_mb"],
        runtime=lambda w: gpu_resources(w.model)["runtime"],
        batch_size=lambda w: model_spec(w.model)["batch_size"],
    log:
        res("logs", "answer_depthqa", "{model}.log"),
    benchmark:
        res("benchmarks", "answer_depthqa", "{model}.tsv")
    script:
        "../scripts/answer_depthqa.py"


rule judge_answers:
    input:
        answers=depth_dir("answers.parquet"),
        data=res("data", "depthqa.parquet"),
        code=code("judge"),
    output:
        depth_dir("scores.parquet"),
    params:
        judge=DEPTH["judge"],
        # verdicts are cached here, outside results/, so a rerun or a crash never pays twice
        cache="resources/judge_cache/{model}.jsonl",
    log:
        res("logs", "judge_answers", "{model}.log"),
    script:
        "../scripts/judge_answers.py"


rule depth_tables:
    input:
        mink=expand(res("depth", "{model}", "mink.parquet"), model=DEPTH["models"]),
        scores=expand(res("depth", "{model}", "scores.parquet"), model=DEPTH["models"]),
        questions=res("data", "depthqa.parquet"),
        nodes=res("data", "depthqa_nodes.parquet"),
        code=code("depth"),
    output:
        per_question=res("tables", "depth_per_question.parquet"),
        depthwise=res("tables", "depth_depthwise.parquet"),
        gaps=res("tables", "depth_score_gaps.parquet"),
        subsets=res("tables", "depth_memorization_subsets.parquet"),
        pooled=res("tables", "depth_pooled_by_depth.tsv"),
    params:
        models=DEPTH["models"],
        k_plot=DEPTH["mink"]["k_plot"],
        memorization=DEPTH["memorization"],
    log:
        res("logs", "depth_tables.log"),
    localrule: True
    script:
        "../scripts/depth_tables.py"


rule plot_depth:
    input:
        depthwise=res("tables", "depth_depthwise.parquet"),
        subsets=res("tables", "depth_memorization_subsets.parquet"),
        code=code("plots_depth"),
    output:
        boxes_png=report(
            res("figures", "depth_mink_boxes.png"), category="Depth", caption="../report/depth_boxes.rst"
        ),
        boxes_pdf=res("figures", "depth_mink_boxes.pdf"),
        gap_png=report(
            res("figures", "depth_score_gap_density.png"),
            category="Depth",
            caption="../report/depth_gap.rst",
        ),
        gap_pdf=res("figures", "depth_score_gap_density.pdf"),
    params:
        models=config["figures"]["depth"],
        titles={m: model_spec(m).get("display_name", m) for m in config["figures"]["depth"]},
        caption=depth_caption,
    log:
        res("logs", "plot_depth.log"),
    localrule: True
    script:
        "../scripts/plot_depth.py"
