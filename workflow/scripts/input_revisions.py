import json
from pathlib import Path

import polars as pl

from truthflow import runlog
from truthflow.answer_backend import answers_writer
from truthflow.hub import sha256_of
from truthflow.prepared import INFO_FILE

COLUMNS = ["kind", "name", "source", "requested", "revision", "files", "sha256", "note"]


def row(kind, name, source, requested, revision, files: dict, note) -> dict:
    listed = "; ".join(f"{path} {digest}" for path, digest in files.items())
    return dict(
        zip(COLUMNS, [kind, name, source, requested, revision, len(files), listed, note], strict=True)
    )


def main(sm):
    rows = []
    for model_dir in sm.input.models:
        info = json.loads(Path(model_dir, INFO_FILE).read_text())
        name, spec = info["name"], sm.params.specs[info["name"]]
        if resolved := info.get("resolved"):
            recorded = [resolved[k] for k in ("source", "requested", "revision", "files")]
            rows.append(row("model", name, *recorded, resolved.get("note", "hub snapshot")))
        else:
            what = (
                "hub snapshot prepared before truthflow recorded revisions"
                if "hub" in spec
                else "not a hub model"
            )
            rows.append(row("model", name, json.dumps(spec), spec.get("revision"), None, {}, what))
    for path in sm.input.datasets:
        r = json.loads(Path(path).read_text())
        rows.append(
            row("dataset", r["name"], r["source"], r["requested"], r["revision"], r["files"], r["note"])
        )
    for path, (name, spec) in zip(sm.input.released, sm.params.released_files.items(), strict=True):
        files = {Path(spec["url"]).name: sha256_of(path)}
        rows.append(
            row("released answers", name, spec["url"], spec["sha256"], None, files, "pinned by sha256")
        )
    for name, writer in map(answers_writer, sm.input.answers):  # vLLM (which build) or the engine
        rows.append(row("answers", name, writer, None, None, {}, "the backend that generated them"))
    table = pl.DataFrame(rows, schema=dict.fromkeys(COLUMNS, pl.String) | {"files": pl.Int64})
    with pl.Config(tbl_rows=60, tbl_width_chars=200, fmt_str_lengths=70):
        print(table.drop("sha256"), flush=True)
    table.write_csv(sm.output[0], separator="\t")


runlog.run(snakemake, main)  # noqa: F821
