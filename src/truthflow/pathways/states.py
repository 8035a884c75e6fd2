"""What a rerun must re-extract: with `pathways.keep_states` false, the residual states are removed after
their last reader, so a later change to the settings of a reader (probe_deltap, pathway_experiments) makes
Snakemake rerun extract_pathways on the GPU to write them again. Each reader records the settings it ran
with beside its outputs; before any job, the run compares them with the config's and names the runs that
will be re-extracted, and why."""

import json
from collections.abc import Mapping
from pathlib import Path

# each reader of the states: the file its settings are recorded in, and the states it reads
READERS = {
    "probe_deltap": ("probe_settings.json", ("resid_clean", "resid_ko", "resid_control")),
    "pathway_experiments": ("experiments_settings.json", ("resid_clean",)),
}


def settings_text(settings: Mapping) -> str:
    return json.dumps(settings, sort_keys=True, indent=1, default=str)


def write_settings(path, settings: Mapping) -> None:
    """A reader's record of the settings it ran with (its `settings` output)."""
    Path(path).write_text(settings_text(settings) + "\n")


def changed_keys(recorded: Mapping, current: Mapping, prefix: str = "pathways") -> list[str]:
    """The dotted keys whose values differ between two settings mappings (nested mappings walked)."""
    keys = []
    for key in sorted(set(recorded) | set(current)):
        old, new = recorded.get(key), current.get(key)
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            keys += changed_keys(old, new, f"{prefix}.{key}")
        elif json.dumps(old, default=str) != json.dumps(new, default=str):
            keys.append(f"{prefix}.{key}")
    return keys


def reextractions(run_dirs: Mapping[tuple[str, str], Path], settings: Mapping[str, Mapping]) -> list[str]:
    """'model/dataset (reader: changed keys; ...)' for every run whose removed states a reader with changed
    settings needs again; settings: each reader's current settings."""
    found = []
    for (model, dataset), folder in run_dirs.items():
        why = []
        for reader, (record, reads) in READERS.items():
            path = folder / record
            gone = [name for name in reads if not (folder / f"{name}.npy").exists()]
            if not path.is_file() or not gone:
                continue
            changed = changed_keys(json.loads(path.read_text()), json.loads(settings_text(settings[reader])))
            if changed:
                why.append(f"{reader}: {', '.join(changed)}")
        if why:
            found.append(f"{model}/{dataset} ({'; '.join(why)})")
    return found


def reextraction_message(found: list[str]) -> str | None:
    if not found:
        return None
    runs = "; ".join(found)
    return (
        "truthflow: the settings of a reader of removed residual states changed, so extract_pathways "
        f"re-extracts them on the GPU for {len(found)} run(s): {runs}. "
        "pathways.keep_states: true keeps them next time."
    )
