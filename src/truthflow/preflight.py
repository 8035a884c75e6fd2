"""What the Snakefile does with the config before any job, each refusal one line naming the key or file."""

import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from .config import check_config, fill_defaults
from .data import check_local_sources
from .depth import authors
from .depth.judge import check_judge_config
from .depth.prompts import load_answer_prompt
from .errors import TruthflowError
from .hub import revision_problem
from .memplan import fit_to_memory


def prepare_config(
    config: dict, configfiles: Iterable = (), environ: Mapping[str, str] | None = None
) -> dict:
    """In place: check the config; fit batch_size and token_budget where left out (memplan); fill defaults;
    check the data, prompt files and judge, so a dry run stops before hours of model jobs."""
    full = check_config(config, configfiles)
    check_revision_values(config)
    fit_to_memory(config, full)
    fill_defaults(config)
    check_local_sources(config)
    depth = config["depth"]
    if depth["models"] or depth["released_answers"]:
        check_judge_config(depth["judge"], os.environ if environ is None else environ)
    if depth["models"] and not authors.pending(depth["prompt"]):  # rule authors_prompts checks its files
        load_answer_prompt(depth["prompt"])
    return config


def check_revision_values(config: dict) -> None:
    """Every model's and dataset's source.revision is a commit, a date, a branch or tag, or null (the schema
    has checked it is text); here, not in truthflow.config, which imports no module a rule's code counts."""
    for section, entries in (("models", config.get("models")), ("datasets", config.get("datasets"))):
        for name, spec in (entries or {}).items():
            revision = (spec.get("source") or {}).get("revision")
            if revision is not None and (why := revision_problem(revision)):
                raise TruthflowError(
                    f"config key '{section}.{name}.source.revision': {revision!r} is neither a commit "
                    f"(40 hex digits), a date (YYYY-MM-DD) nor a branch or tag name: {why}"
                )


GB = 1e9


def _existing(path: Path) -> Path:
    """The nearest existing folder at or above path (a fresh run has no results/ yet)."""
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def disk_refusal(config: dict, planned, free_bytes: Mapping[str, int]) -> str | None:
    """Why a run whose disk plan is `planned` (diskplan.DiskPlan: the new files of the jobs this invocation
    runs) cannot fit, or None: the weights go to resources/, the states and experiment files to results/;
    `free_bytes` by folder, one entry where one limit holds both (`free_space`)."""
    needs = {"resources": planned.weights_bytes, "results": planned.peak_bytes - planned.weights_bytes}
    if len(free_bytes) == 1:
        needs = {next(iter(free_bytes)): sum(needs.values())}
    short = {where: (need, free_bytes[where]) for where, need in needs.items() if need > free_bytes[where]}
    if not short:
        return None
    where, (need, free) = next(iter(short.items()))
    cuts = []
    if config["pathways"]["models"] and config["pathways"].get("keep_states", True):
        cuts.append("pathways.keep_states: false (states removed after their last reader)")
    if planned.gpu_slots > 1:
        cuts.append(f"fewer GPUs at once (planned: {planned.gpu_slots}; a profile's resources: gpu=N)")
    cuts += ["fewer models or a smaller n per dataset", "disk.check: false to skip this check"]
    weights, activations = planned.weights_bytes / GB, planned.activation_peak_bytes / GB
    return (
        f"the run needs {need / GB:,.0f} GB of disk at its peak in {where}/ (new weights {weights:,.0f} GB, "
        f"activation files {activations:,.0f} GB at once), {free / GB:,.0f} GB free: {'; '.join(cuts)} "
        "(python -m truthflow.bill prints the plan)"
    )


def free_space(config: dict, root: Path = Path(".")) -> dict[str, int]:
    """Bytes this run may still write, by folder ("resources", "results"; one entry naming both where one
    filesystem holds them): disk.free_gb where a quota is the limit, else each filesystem's free space."""
    folders = {"resources": root / "resources", "results": root / "results" / config["run"]}
    devices: dict[int, str] = {}
    for where, folder in folders.items():
        devices.setdefault(_existing(folder).stat().st_dev, where)
    quota = config["disk"]["free_gb"]
    if quota is not None or len(devices) == 1:  # one limit for both: the message names both folders
        free = int(quota * GB) if quota is not None else shutil.disk_usage(_existing(folders["results"])).free
        return {"results/ and resources": free}
    return {where: shutil.disk_usage(_existing(folders[where])).free for where in devices.values()}


def disk_line(planned, free: Mapping[str, int], reason: str | None) -> str:
    """The plan in one line, for a dry run: its peak, the free space, and the real run's refusal if any."""
    space = ", ".join(f"{b / GB:,.0f} GB free in {where}/" for where, b in free.items())
    verdict = f"the run would be refused: {reason}" if reason else "it fits"
    return f"truthflow: disk plan: {planned.line()}; {space}: {verdict}"


def check_disk(config: dict, planned, free: Mapping[str, int]) -> None:
    """Before any job: refuse a run whose planned peak of new files (`diskplan.plan` given the jobs and
    weights already done) exceeds the free space (`free_space`); disk.check: false skips this."""
    if not config["disk"]["check"]:
        return
    if reason := disk_refusal(config, planned, free):
        raise TruthflowError(reason)
