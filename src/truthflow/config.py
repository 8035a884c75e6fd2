"""Config defaults for the per-model / per-dataset entries (the schema's $defs) and cross-key checks."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from .errors import TruthflowError

SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"


def _defaults(props: dict) -> dict:
    return {k: copy.deepcopy(v["default"]) for k, v in props.items() if "default" in v}


def fill_entries(config: dict, schema_path: Path = SCHEMA) -> dict:
    """Fill each model's and dataset's missing keys from the schema's $defs defaults."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    model_def, data_def = schema["$defs"]["model"]["properties"], schema["$defs"]["dataset"]["properties"]
    for spec in config.get("models", {}).values():
        for k, v in _defaults(model_def).items():
            spec.setdefault(k, v)
    for spec in config.get("datasets", {}).values():
        for k, v in _defaults(data_def).items():
            spec.setdefault(k, v)
        src_defaults = _defaults(data_def["source"]["properties"])
        for k, v in src_defaults.items():
            spec["source"].setdefault(k, v)
    pw = config.setdefault("pathways", {})
    if pw.get("datasets") is None:
        pw["datasets"] = [
            d for d in ("popqa", "triviaqa", "hotpotqa", "nq") if d in config.get("datasets", {})
        ]
    return config


def check_names(config: dict) -> None:
    """Every model/dataset named elsewhere in the config must be defined; the message names the key."""
    models, datasets = set(config["models"]), set(config["datasets"])

    def need(names, known, key, kind):
        for name in names:
            if name not in known:
                raise TruthflowError(
                    f"config key '{key}' names {kind} '{name}', which is not defined under '{kind}s' "
                    f"(defined: {', '.join(sorted(known)) or 'none'})"
                )

    need(config["pathways"]["models"], models, "pathways.models", "model")
    need(config["pathways"]["datasets"], datasets, "pathways.datasets", "dataset")
    need(config["depth"]["models"], models, "depth.models", "model")
    for i, pair in enumerate(config["figures"]["pathways"]):
        need(pair, set(config["pathways"]["models"]), f"figures.pathways[{i}]", "model")
    need(config["figures"]["depth"], set(config["depth"]["models"]), "figures.depth", "model")
    if config["depth"]["models"] and "depthqa" not in datasets:
        raise TruthflowError("config key 'depth.models' is set but 'datasets.depthqa' is not defined")
    ps = config["pathways"]
    if ps["anchor_split"] == "fixed_layer" and ps.get("fixed_layer") is None:
        raise TruthflowError("config key 'pathways.fixed_layer' must be set when anchor_split is fixed_layer")
