"""The conda env is generated from requirements.lock (tests/test_lock.py checks the lock against pyproject and
the README); cluster profiles give every model rule its threads and CPUs."""

from __future__ import annotations

import re
import sys

import pytest
import yaml
from conftest import REPO

sys.path.insert(0, str(REPO / "envs"))
import make_env  # noqa: E402

PROFILES = ("slurm", "slurm-ci")


def test_conda_env_is_generated_from_the_lock():
    assert make_env.main(["--check"]) == 0, "run: python envs/make_env.py"


def _model_rules() -> list[str]:
    """Rules with a `gpu` resource, read off workflow/rules/*.smk."""
    rules = []
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        blocks = re.split(r"^(?:rule|checkpoint) (\w+):", smk.read_text(), flags=re.M)
        for name, body in zip(blocks[1::2], blocks[2::2], strict=True):
            if re.search(r"^\s+gpu\s*=", body, flags=re.M):
                rules.append(name)
    return rules


def test_model_rules_are_discovered():
    assert {"generate_answers", "extract_pathways", "score_mink", "answer_depthqa"} <= set(_model_rules())


@pytest.mark.parametrize("profile", PROFILES)
def test_every_model_rule_gets_threads_and_cpus_on_a_cluster(profile):
    cfg = yaml.safe_load((REPO / "profiles" / profile / "config.yaml").read_text())
    threads = cfg.get("set-threads") or {}
    resources = cfg.get("set-resources") or {}
    for rule in _model_rules():
        assert isinstance(threads.get(rule), int) and threads[rule] >= 1, f"{profile}: set-threads.{rule}"
        cpus = (resources.get(rule) or {}).get("cpus_per_task")
        assert cpus == threads[rule], f"{profile}: set-resources.{rule}.cpus_per_task"
