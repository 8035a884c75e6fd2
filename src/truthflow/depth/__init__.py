"""DepthQA: one module per idea, in the order of workflow/rules/depth.smk: mink (MIN-K% scoring) -> judge
(answer grading) -> tables (depthwise tables, score gaps) -> plots. Kept empty of imports (see pathways)."""
