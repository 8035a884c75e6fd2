"""The conda env is generated from requirements.lock (tests/test_lock.py checks the lock against pyproject and
the README); cluster profiles give every model rule its threads and CPUs."""

from __future__ import annotations

import sys

import pytest
import yaml
from conftest import REPO

sys.path.insert(0, str(REPO / "envs"))
sys.path.insert(0, str(REPO / "profiles"))
import make_env  # noqa: E402
import make_profiles  # noqa: E402

PROFILES = ("slurm", "slurm-ci")


def test_conda_env_is_generated_from_the_lock():
    assert make_env.main(["--check"]) == 0, "run: python envs/make_env.py"


def test_cluster_profiles_are_generated_from_the_rules():
    assert make_profiles.main(["--check"]) == 0, "run: python profiles/make_profiles.py"


def test_model_rules_are_discovered():
    assert {"generate_answers", "extract_pathways", "score_mink", "answer_depthqa"} <= set(
        make_profiles.model_rules()
    )


@pytest.mark.parametrize("profile", PROFILES)
def test_every_model_rule_gets_threads_and_cpus_on_a_cluster(profile):
    cfg = yaml.safe_load((REPO / "profiles" / profile / "config.yaml").read_text())
    threads = cfg.get("set-threads") or {}
    resources = cfg.get("set-resources") or {}
    for rule in make_profiles.model_rules():
        assert isinstance(threads.get(rule), int) and threads[rule] >= 1, f"{profile}: set-threads.{rule}"
        cpus = (resources.get(rule) or {}).get("cpus_per_task")
        assert cpus == threads[rule], f"{profile}: set-resources.{rule}.cpus_per_task"


def test_a_stale_profile_is_reported(tmp_path, monkeypatch):
    """--check fails on a profile whose model-rule section lost a rule, and a rewrite restores it."""
    import shutil

    for name in PROFILES:
        shutil.copytree(REPO / "profiles" / name, tmp_path / "profiles" / name)
    shutil.copytree(REPO / "workflow" / "rules", tmp_path / "workflow" / "rules")
    monkeypatch.setattr(make_profiles, "ROOT", tmp_path)
    cfg = tmp_path / "profiles" / "slurm" / "config.yaml"
    cfg.write_text(
        "\n".join(line for line in cfg.read_text().splitlines() if "score_mink" not in line) + "\n"
    )
    assert make_profiles.main(["--check"]) == 1
    assert make_profiles.main([]) == 0 and make_profiles.main(["--check"]) == 0
    assert "score_mink: {cpus_per_task: 8}" in cfg.read_text()


@pytest.mark.parametrize("profile", PROFILES)
def test_the_local_profile_overrides_nothing_a_cluster_profile_sets(profile):
    """profiles/default is loaded with every --profile and wins over it (Snakemake 9): a key both set must
    agree, or a cluster run silently takes the local value (a 5 s latency wait on a shared filesystem)."""
    local = yaml.safe_load((REPO / "profiles" / "default" / "config.yaml").read_text())
    cluster = yaml.safe_load((REPO / "profiles" / profile / "config.yaml").read_text())
    clash = {k: (local[k], cluster[k]) for k in local.keys() & cluster.keys() if local[k] != cluster[k]}
    assert not clash, f"profiles/default overrides profiles/{profile}: {clash}"
