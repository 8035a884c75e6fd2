"""The conda env agrees with pyproject.toml and the README install; cluster profiles give every model rule
its threads and CPUs."""

from __future__ import annotations

import re
import shlex
import sys
import tomllib

import pytest
import yaml
from conftest import REPO
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

sys.path.insert(0, str(REPO / "envs"))
import make_env  # noqa: E402

PROFILES = ("slurm", "slurm-ci")


def _env_requirements() -> dict[str, Requirement]:
    env = yaml.safe_load(make_env.ENV.read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    reqs = [Requirement(r) for r in pip]
    deploy = make_env.POST_DEPLOY.read_text()
    line = next(li for li in deploy.splitlines() if li.startswith("python -m pip install --no-deps"))
    reqs += [Requirement(w) for w in shlex.split(line.split("--no-deps", 1)[1])]
    return {canonicalize_name(r.name): r for r in reqs}


def _readme_installs() -> list[str]:
    """Every `pip install ...` argument of the README's first (demo) command."""
    block = (REPO / "README.md").read_text().split("```bash", 1)[1].split("```", 1)[0]
    args = []
    for part in block.split("&&"):
        words = shlex.split(part)
        if words[:2] == ["pip", "install"]:
            args += words[2:]
    return args


def test_conda_env_is_generated_from_pyproject():
    assert make_env.main(["--check"]) == 0, "run: python envs/make_env.py"


def test_conda_env_has_every_readme_package_with_pyproject_pins():
    env = _env_requirements()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {canonicalize_name(Requirement(r).name): Requirement(r) for r in project["dependencies"]}
    args = _readme_installs()
    assert args, "no pip install in the README's demo command"
    wanted = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-e":
            extras = re.search(r"\[(.*)\]", args[i + 1])
            names = extras.group(1).split(",") if extras else []
            assert sorted(names) == sorted(make_env.EXTRAS)
            wanted += list(project["dependencies"])
            for extra in names:
                wanted += project["optional-dependencies"][extra]
            i += 2
            continue
        if arg == "--no-deps":
            i += 1
            continue
        wanted.append(arg)
        i += 1
    no_deps = {canonicalize_name(w) for w in args[args.index("--no-deps") + 1 :] if not w.startswith("-")}
    assert no_deps == {canonicalize_name(n) for n in make_env.NO_DEPS}
    for spec in wanted:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in env, f"{req.name} (README) is missing from envs/truthflow.yaml"
        if name in declared:  # the env pins what pyproject pins, and the README's own pin satisfies it
            assert env[name].specifier == declared[name].specifier, name
            for pin in req.specifier:
                assert declared[name].specifier.contains(pin.version), f"README {spec} vs pyproject"
        elif req.specifier:
            assert env[name].specifier == req.specifier, name


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
