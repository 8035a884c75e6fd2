rule benchmark_table:
    input:
        tables=[getattr(rules, r).benchmark.format(**w) for r, w in benchmarked_jobs()],
        peaks=[getattr(rules, r).output.peaks.format(**w) for r, w in benchmarked_jobs()],
        code=code_inputs("benchmark_table.py"),
    output:
        results_path("tables", "benchmarks.tsv"),
    log:
        results_path("logs", "benchmark_table.log"),
    localrule: True
    params:
        # an analysis job's shape beside its figures: the bill takes a finished run's figure for that shape
        jobs=[
            {"rule": r, "dataset": "depthqa", **w, **sizing.job_shape(config, r, **w)}
            for r, w in benchmarked_jobs()
        ],
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/benchmark_table.py"


rule compare_published:
    input:
        **optional_inputs(pw_runs(), rules.pathways_tables, pathways="summary", check="check"),
        **optional_inputs(pw_runs(), rules.experiment_tables, "rows", "awareness", "detection"),
        **optional_inputs(
            config["depth"]["models"], rules.depth_tables, "depthwise", "pooled", depth_metrics="metrics"
        ),
        **optional_inputs(config["depth"]["released_answers"], rules.released_metrics, released="metrics"),
        published=checkout_path("workflow", "report", "published.tsv"),
        code=code_inputs("compare_published.py"),
    output:
        results_path("tables", "published_vs_reproduced.tsv"),
    log:
        results_path("logs", "compare_published.log"),
    localrule: True
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/compare_published.py"


rule table_html:
    input:
        table=results_path("tables", "{table}.tsv"),
        code=code_inputs("table_html.py"),
    output:
        report(results_path("report", "{table}.html"), category="Tables", caption="../report/table.rst"),
    log:
        results_path("logs", "table_html", "{table}.log"),
    wildcard_constraints:
        table="|".join(REPORT_TABLES),
    localrule: True
    params:
        title=lambda w: REPORT_TABLES[w.table][0],
        caption=lambda w: table_caption(checkout_path("workflow", "report", REPORT_TABLES[w.table][1])),
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/table_html.py"


rule front_page:
    input:
        compared=rules.compare_published.output[0],
        **optional_inputs(pw_runs(), rules.pathways_tables, check="check_tsv", layers="check_layers"),
        code=code_inputs("front_page.py"),
    output:
        results_path("report", "front_page.rst"),
    log:
        results_path("logs", "front_page.log"),
    localrule: True
    params:
        links=front_page_links(),
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/front_page.py"
