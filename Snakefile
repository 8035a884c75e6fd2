# truthflow: reproduce the Two Pathways (attention knockout) and DepthQA (MIN-K%) figures end to end.
# Usage: snakemake --cores 8   (config.yaml: offline demo; configs/paper-*.yaml: the papers)
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config.yaml"


validate(config, "workflow/schemas/config.schema.yaml", set_default=True)


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/generate.smk"
include: "workflow/rules/pathways.smk"
include: "workflow/rules/depth.smk"


rule all:
    input:
        all_targets(),
    default_target: True
