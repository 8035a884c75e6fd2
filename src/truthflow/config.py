"""Config checks (`check_config`), schema defaults (`fill_defaults`, `schema_defaults`); no science import."""

import copy
import re
from collections.abc import Iterable, Mapping
from datetime import date
from functools import cache
from pathlib import Path

import yaml

from . import registry
from .errors import TruthflowError

SCHEMA = Path(__file__).resolve().parent / "schemas" / "config.schema.yaml"  # package data
SCHEMA_DOC = "src/truthflow/schemas/config.schema.yaml"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@cache
def _schema() -> dict:
    return yaml.safe_load(SCHEMA.read_text())


def _filled(node: dict, given: Mapping) -> dict:
    out = dict(given)
    for key, spec in node.get("properties", {}).items():
        if "properties" in spec and isinstance(out.get(key, spec.get("default")), dict):
            out[key] = _filled(spec, out.get(key) or {})
        elif key not in out and "default" in spec:
            out[key] = copy.deepcopy(spec["default"])
    return out


def schema_defaults(*section: str, given: Mapping | None = None) -> dict:
    """A config section (`schema_defaults("pathways", "check")`) as the workflow fills it."""
    node = _schema()
    for key in section:
        node = node["properties"][key]
    return _filled(node, given or {})


# keys an older config may carry, and why they are gone
RETIRED_KEYS = dict.fromkeys(
    ("mem_mb", "runtime"),
    "no longer set by hand: every job's runtime and memory follow from the bill (cluster.max_runtime_h, "
    "cluster.runtime_margin; docs/cluster.md)",
)


def check_schema(config: dict) -> None:
    """The config against the schema in one line naming the key (Snakemake's validate prints the schema)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    errors = list(Draft202012Validator(_schema()).iter_errors(config))
    if not (err := best_match(errors)):
        return
    key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)[1:]
    desc = err.schema.get("description") if isinstance(err.schema, dict) else None
    desc = desc.strip() if desc else desc  # a folded YAML description (`>`) ends in a newline
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    # the key's description where its value is wrong, not where a key is missing or unexpected
    value_error = err.validator in {"type", "enum", "pattern", "minimum", "oneOf"}
    hint = f" ({desc})" if desc and value_error else ""
    if err.validator == "additionalProperties" and (gone := RETIRED_KEYS.keys() & set(err.instance)):
        hint = f" ({', '.join(sorted(gone))}: {RETIRED_KEYS[min(gone)]})"
    where = key or "the config's top level"
    raise TruthflowError(f"{where}: {err.message}{hint}{more}; every key is documented in {SCHEMA_DOC}")


def fill_defaults(config: dict) -> dict:
    """The defaults into `config`, in place: hub sources, the schema's, pathways.datasets (null: QA sets)."""
    from snakemake.utils import validate

    for name, spec in config["datasets"].items():
        registry.fill_source(name, spec)
    validate(config, str(SCHEMA), set_default=True)
    if config["pathways"]["datasets"] is None:
        config["pathways"]["datasets"] = [d for d in registry.qa_names() if d in config["datasets"]]
    return config


def check_path_names(config: dict) -> None:
    """`run`, model, dataset names go into paths: no '/', '..' or leading dot (before the schema's regex)."""
    named = [("run", config.get("run", "demo"))]
    for kind in ("models", "datasets"):
        if isinstance(config.get(kind), dict):
            named += [(f"{kind}.{name}", name) for name in config[kind]]
    for key, name in named:
        why = "use letters, digits, '_', '.', '-', starting with a letter or digit"
        if isinstance(name, str) and NAME.match(name):
            why = "'..' is not allowed" if ".." in name else None
        if why:
            raise TruthflowError(f"config key '{key}': {name!r} is not a safe file name ({why})")
        if key.startswith("models.") and "__" in name:
            raise TruthflowError(
                f"config key '{key}': model name {name!r} contains '__', which joins the two models "
                "of a figure pair in file names"
            )


def check_sources(config: dict) -> None:
    """Null source keys dropped where null is no value; a date revision made text (its form is checked by
    preflight.check_revision_values); a source of two kinds refused (config files merge)."""
    for entry in ("model", "dataset"):
        section = f"{entry}s"
        schema = _schema()["$defs"][entry]["properties"]["source"]
        props = schema["properties"]
        kinds = [rule["required"][0] for rule in schema["oneOf"]]  # hub, local, ...: each rule's first key
        entries = config.get(section)
        if not isinstance(entries, dict):
            continue
        for name, spec in entries.items():
            source = spec.get("source") if isinstance(spec, dict) else None
            if not isinstance(source, dict):
                continue
            null_keys = [k for k, v in source.items() if v is None and k in props]
            for key in null_keys:
                types = props[key].get("type", [])
                allowed = [types] if isinstance(types, str) else types
                if "null" not in allowed:
                    del source[key]
            if isinstance(source.get("revision"), date):  # YAML reads an unquoted 2024-06-26 as a date
                source["revision"] = source["revision"].isoformat()
            given = [k for k in source if k in kinds]
            if len(given) < 2:
                continue
            keep, drop = given[-1], given[:-1]  # a merged-in key comes after the keys it was merged into
            example = ", ".join([f"{keep}: {source[keep]}", *(f"{k}: null" for k in drop)])
            raise TruthflowError(
                f"config key '{section}.{name}.source' gives {len(given)} kinds of source "
                f"({', '.join(f'{k}: {source[k]!r}' for k in given)}); it takes one. Config files given "
                "together (--configfile config.yaml overlay.yaml) merge mapping by mapping, so an overlay's "
                f"source keeps the kind it replaces: set that kind to null, e.g. source: {{{example}}} "
                "(docs/configuration.md)"
            )


def _duplicate_keys(node, path: str = ""):
    """(dotted key, first line, repeated line) of each repeated key of a composed YAML node."""
    if isinstance(node, yaml.MappingNode):
        seen: dict = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            dotted = f"{path}.{key}" if path else str(key)
            line = key_node.start_mark.line + 1
            if key in seen:
                yield dotted, seen[key], line
            elif key not in (None, "<<"):
                seen[key] = line
            yield from _duplicate_keys(value_node, dotted)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _duplicate_keys(item, f"{path}[{i}]")


def check_config_files(paths) -> None:
    """A key given twice in a YAML config file (one Snakemake loaded) is an error."""
    for path in map(Path, paths):
        if not path.is_file():
            continue
        try:
            root = yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
        except (yaml.YAMLError, UnicodeDecodeError):
            continue  # Snakemake has read it (JSON, YTE); nothing more to check here
        if found := list(_duplicate_keys(root)):
            key, first, again = found[0]
            more = f" (and {len(found) - 1} more repeated key(s))" if len(found) > 1 else ""
            raise TruthflowError(
                f"config file '{path}': key '{key}' is given twice, on lines {first} and {again}; "
                f"YAML would silently keep the last one{more}"
            )


def check_names(config: dict) -> None:
    """Every dataset is registered; every model/dataset named elsewhere in the config is defined, once."""
    if unknown := [name for name in config["datasets"] if name not in registry.names()]:
        raise TruthflowError(
            f"config key 'datasets.{unknown[0]}': '{unknown[0]}' is not a registered dataset (registered: "
            f"{', '.join(registry.names())}); a new QA set is an entry in src/truthflow/registry.py"
        )
    pw = config["pathways"]
    depth = config["depth"]
    figures = config["figures"]
    models = set(config["models"])
    datasets = set(config["datasets"])
    listed = {f"pathways.{k}": pw[k] for k in ("models", "datasets")} | {"depth.models": depth["models"]}
    figure_lists = {f"figures.{k}": figures[k] for k in ("depth", "pathways")}
    for key, names in (listed | figure_lists).items():
        seen = [tuple(n) if isinstance(n, list) else n for n in names]
        if twice := [name for i, name in enumerate(names) if seen[i] in seen[:i]]:
            raise TruthflowError(
                f"config key '{key}' lists {twice[0]!r} twice; list each once "
                "(a repeat would duplicate its rows in the summary tables)"
            )
    for i, pair in enumerate(figures["pathways"]):
        if len(pair) == 2 and pair[0] == pair[1]:
            raise TruthflowError(
                f"config key 'figures.pathways[{i}]' pairs model '{pair[0]}' with itself; "
                "give two different models, or one model alone"
            )
    named = [(key, names, None) for key, names in listed.items()]  # (key, names, the stage a figure reads)
    named += [(f"figures.pathways[{i}]", pair, "pathways") for i, pair in enumerate(figures["pathways"])]
    for key, names, stage in [*named, ("figures.depth", figures["depth"], "depth")]:
        if key == "pathways.datasets":
            kind, known = "dataset", datasets
        else:
            kind, known = "model", models
        for name in names:
            if name not in known:
                raise TruthflowError(
                    f"config key '{key}' names {kind} '{name}', which is not defined under '{kind}s' "
                    f"(defined: {', '.join(sorted(known)) or 'none'})"
                )
            if stage is None:
                continue
            ran = config[stage]["models"]
            if name not in ran:
                # an overlay that empties a stage's models keeps the figures list it overlays: name both fixes
                raise TruthflowError(
                    f"config key '{key}' names model '{name}', which {stage}.models does not run "
                    f"({stage}.models: {', '.join(ran) or 'none'}); add '{name}' to {stage}.models, or leave "
                    f"it out of figures.{stage} (figures.{stage}: [] draws no {stage} figure)"
                )
    if not_qa := [name for name in pw["datasets"] if not registry.is_qa(name)]:
        raise TruthflowError(
            f"config key 'pathways.datasets' names '{not_qa[0]}', which is not a QA set "
            f"(QA sets: {', '.join(registry.qa_names())})"
        )
    if depth["models"] and "depthqa" not in datasets:
        raise TruthflowError("config key 'depth.models' is set but 'datasets.depthqa' is not defined")
    for name in depth.get("released_answers", {}):
        key = f"config key 'depth.released_answers.{name}'"
        if name not in models or name in depth["models"] or "depthqa" not in datasets:
            raise TruthflowError(
                f"{key}: a released answers file needs its model defined under 'models', left out of "
                f"depth.models (its answers are read, not generated), and 'datasets.depthqa' (its graph)"
            )
    if pw["anchor_split"] == "fixed_layer" and pw.get("fixed_layer") is None:
        raise TruthflowError("config key 'pathways.fixed_layer' must be set when anchor_split is fixed_layer")
    span = pw.get("check", {}).get("layers")
    if isinstance(span, list) and span[0] > span[1]:
        raise TruthflowError(
            f"config key 'pathways.check.layers' is [from, to] with from <= to (1-based), got {span}"
        )


def check_depth(depth: dict) -> None:
    """Settings of the (filled) depth section that must agree with each other."""
    mink = depth["mink"]
    memo = depth["memorization"]
    if not depth["models"]:
        return
    if mink["k_plot"] not in mink["k_grid"]:
        raise TruthflowError(
            f"config key 'depth.mink.k_plot' ({mink['k_plot']:g}) must be one of depth.mink.k_grid "
            f"{mink['k_grid']}"
        )
    if memo["lower_quantile"] >= memo["upper_quantile"]:
        raise TruthflowError(
            "config key 'depth.memorization.lower_quantile' must be below upper_quantile, got "
            f"{memo['lower_quantile']} and {memo['upper_quantile']}"
        )


def check_config(config: dict, configfiles: Iterable = ()) -> dict:
    """Every check of the config itself, each a TruthflowError naming the key or file. `config` is left as
    given (but for source keys set to null); the checks that need defaults run on a filled copy, returned."""
    check_config_files(configfiles)
    check_path_names(config)
    check_sources(config)
    check_schema(config)
    full = fill_defaults(copy.deepcopy(config))
    check_names(full)
    check_depth(full["depth"])
    return full
