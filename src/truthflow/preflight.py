"""What the Snakefile does with the config before any job, each refusal one line naming the key or file."""

import os
from collections.abc import Iterable, Mapping

from .config import check_config, fill_defaults
from .data import check_local_sources
from .depth import authors
from .depth.judge import check_judge_config
from .depth.prompts import load_answer_prompt
from .memplan import fit_to_memory


def prepare_config(
    config: dict, configfiles: Iterable = (), environ: Mapping[str, str] | None = None
) -> dict:
    """In place: check the config; fit batch_size and token_budget where left out (memplan); fill defaults;
    check the data, prompt files and judge, so a dry run stops before hours of model jobs."""
    fit_to_memory(config, check_config(config, configfiles))
    fill_defaults(config)
    check_local_sources(config)
    depth = config["depth"]
    if depth["models"] or depth["released_answers"]:
        check_judge_config(depth["judge"], os.environ if environ is None else environ)
    if depth["models"] and not authors.pending(depth["prompt"]):  # rule authors_prompts checks its files
        load_answer_prompt(depth["prompt"])
    return config
