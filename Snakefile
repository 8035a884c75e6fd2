# truthflow: reproduce the Two Pathways (attention knockout) and DepthQA (MIN-K%) figures end to end.
# Usage: snakemake --cores 8   (config.yaml: offline demo; configs/paper-*.yaml: the papers)
import os
import re
import sys
from pathlib import Path

from snakemake.utils import min_version

min_version("9.27.1")  # pyproject.toml pins the tested range


# the embedded demo is the default; a --configfile replaces it instead of being merged into it (no documented
# API says whether one was given; --replace-workflow-config would also drop config.yaml under a lone --config)
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


# the checkout, where the Snakefile is (workflow.source_path would copy a file into Snakemake's source cache)
CHECKOUT = Path(workflow.basedir)
sys.path.insert(0, str(CHECKOUT / "src"))
from truthflow.errors import TruthflowError  # noqa: E402
from truthflow.preflight import prepare_config  # noqa: E402
from truthflow.runlog import stop_jobs_on_sigterm  # noqa: E402

# the config checked, the batches fitted to the GPUs, the defaults filled (truthflow.preflight): a refusal is
# one line naming the key, before any job
try:
    prepare_config(config, workflow.configfiles, os.environ)
except TruthflowError as exc:
    raise WorkflowError(f"invalid config: {exc}")


include: "workflow/rules/common.smk"


wildcard_constraints:
    model="|".join(map(re.escape, MODELS)) if MODELS else "NONE",
    dataset="|".join(map(re.escape, registry.qa_names())),


include: "workflow/rules/data.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/generate.smk"
include: "workflow/rules/pathways.smk"
include: "workflow/rules/depth.smk"
include: "workflow/rules/report.smk"


warn_reextraction()
check_runtime_limit()
print_dry_run_plan()


report: "workflow/report/workflow.rst"


onstart:
    stop_jobs_on_sigterm()
    check_gated_tokens()
    check_revisions()
    check_disk_space()


onsuccess:
    print(finished_message(), file=sys.stderr)


rule all:
    default_target: True
    input:
        all_targets(),
