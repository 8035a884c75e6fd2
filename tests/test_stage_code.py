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
    for rule, body in re.findall(r"(?ms)^rule (\w+):\n(.*?)(?=^\S|\Z)", text):
        script = re.search(r"script:\s*\n?\s*\"([^\"]+)\"", body)
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
