"""A prepared model: the info file of its directory and the handle a job holds once it is loaded. Apart from
truthflow.models, which prepares and loads one, so that truthflow.twins builds one without importing it."""

from __future__ import annotations

from dataclasses import dataclass

INFO_FILE = "truthflow_model.json"


@dataclass
class LoadedModel:
    model: object  # transformers PreTrainedModel
    tokenizer: object
    info: dict
    device: str
    attention: str = "auto"  # the SDPA kernels the engine allows (engine.backend; models.<name>.attention)
