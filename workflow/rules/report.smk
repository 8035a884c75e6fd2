rule benchmark_table:
    input:
        tables=all_benchmarks,
        code=code(),
    output:
        report(
            res("tables", "benchmarks.tsv"),
            category="Benchmarks",
            caption="../report/benchmarks.rst",
        ),
    log:
        res("logs", "benchmark_table.log"),
    localrule: True
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/benchmark_table.py"


rule compare_published:
    input:
        published=checkout_path("workflow", "report", "published.tsv"),
        pathways=optional_input("pathways", res("tables", "pathways_summary.parquet")),
        check=optional_input("pathways", res("tables", "pathways_check.parquet")),
        depthwise=optional_input("depth", res("tables", "depth_depthwise.parquet")),
        pooled=optional_input("depth", res("tables", "depth_pooled_by_depth.tsv")),
        code=code(),
    output:
        report(
            res("tables", "published_vs_reproduced.tsv"),
            category="Published vs reproduced",
            caption="../report/compare.rst",
        ),
    log:
        res("logs", "compare_published.log"),
    localrule: True
    conda:
        "../../envs/truthflow.yaml"
    script:
        "../scripts/compare_published.py"
