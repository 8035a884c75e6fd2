"""A prepared model's info file and loaded handle, apart from truthflow.models so twins need not import it."""

from dataclasses import dataclass

INFO_FILE = "truthflow_model.json"


@dataclass
class LoadedModel:
    model: object  # transformers PreTrainedModel
    tokenizer: object
    info: dict
    device: str
    attention: str = "auto"  # the SDPA kernels the engine allows (engine.backend; models.<name>.attention)
