"""Editing one stage's module reruns none of the other stage's jobs. A script rule's code inputs are the
truthflow modules its script imports (`_script_modules` in workflow/rules/common.smk, run here as the
workflow runs it): a dry run after an edit plans exactly the rules whose code holds the edited file."""

from __future__ import annotations

import functools
import modulefinder
import os
import re
from pathlib import Path

import pytest
from conftest import REPO

RULES = REPO / "workflow" / "rules"
RULE_BLOCK = r"(?ms)^rule (\w+):\n(.*?)(?=^\S|\Z)"
SCRIPT = r"script:\s*\n?\s*\"([^\"]+)\""


def _script_modules():
    """common.smk's own `_script_modules`, its source taken from the file, with the globals it reads."""
    text = (RULES / "common.smk").read_text()
    source = re.search(r"(?ms)^@functools\.cache\ndef _script_modules\(.*?(?=^\S)", text).group(0)
    scope = {"functools": functools, "modulefinder": modulefinder, "os": os, "Path": Path}
    scope |= {"SRC": str(REPO / "src"), "WorkflowError": RuntimeError}
    exec(source, scope)
    return scope["_script_modules"]


def stage_code(stage: str) -> dict[str, set[str]]:
    """rule -> its code inputs (paths relative to the checkout), for every script rule of <stage>.smk."""
    modules = _script_modules()
    text = (RULES / f"{stage}.smk").read_text()
    code = {}
    for rule, body in re.findall(RULE_BLOCK, text):
        script = re.search(SCRIPT, body)
        if script:
            cwd = os.getcwd()
            os.chdir(REPO)  # relative to the working directory, as in a run from the checkout
            try:
                code[rule] = set(modules(str(RULES / script.group(1))))
            finally:
                os.chdir(cwd)
    return code


@pytest.fixture(scope="module")
def code() -> dict[str, dict[str, set[str]]]:
    return {stage: stage_code(stage) for stage in ("pathways", "depth")}


def test_every_stage_rule_has_code(code):
    assert len(code["pathways"]) >= 6 and len(code["depth"]) >= 4, code
    assert "src/truthflow/depth/judge.py" in code["depth"]["judge_answers"]
    assert "src/truthflow/pathways/check.py" in code["pathways"]["pathways_tables"]


def test_editing_the_judge_plans_no_pathways_rule(code):
    planned = [rule for rule, files in code["pathways"].items() if "src/truthflow/depth/judge.py" in files]
    assert planned == []


def test_editing_a_pathways_module_plans_no_depth_rule(code):
    planned = {
        rule: sorted(f for f in files if f.startswith("src/truthflow/pathways/"))
        for rule, files in code["depth"].items()
    }
    assert not any(planned.values()), planned


def test_every_script_rule_declares_its_code_and_environment_where_it_is_defined():
    """Nothing edits a rule after parsing: each script rule's own text names its conda environment and, but
    prepare_model (PREPARE_VERSION keys it), code_inputs of its own script, not of another one."""
    checked = 0
    for smk in sorted(RULES.glob("*.smk")):
        for rule, body in re.findall(RULE_BLOCK, smk.read_text()):
            if not (script := re.search(SCRIPT, body)):
                continue
            assert re.search(r'conda:\n\s+"\.\./\.\./envs/truthflow\.yaml"\n', body), f"{smk.name}: {rule}"
            expected = [] if rule == "prepare_model" else [Path(script.group(1)).name]
            assert re.findall(r'code=code_inputs\("([^"]+)"\)', body) == expected, f"{smk.name}: {rule}"
            checked += 1
    assert checked >= 20
    workflow_text = "".join(f.read_text() for f in [REPO / "Snakefile", *RULES.glob("*.smk")])
    assert not re.search(r"set_input|\.conda_env\b|deploy_script_rules", workflow_text)
