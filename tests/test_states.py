"""Removed residual states: a reader whose settings changed since it ran names the runs it re-extracts."""

import json

from truthflow.pathways import states


def test_changed_keys_walks_nested_settings():
    old = {"probe": {"C": 1.0, "seeds": [0, 1, 2]}, "anchor_split": "per_layer"}
    new = {"probe": {"C": 0.5, "seeds": [0, 1, 2]}, "anchor_split": "per_layer", "fixed_layer": 3}
    assert states.changed_keys(old, new) == ["pathways.fixed_layer", "pathways.probe.C"]
    assert states.changed_keys(old, old) == []


def test_reextractions_only_where_states_are_gone_and_settings_changed(tmp_path):
    settings = {"probe_deltap": {"probe": {"C": 1.0}}, "pathway_experiments": {"probe": {"C": 1.0}}}
    runs = {}
    for model in ("kept", "removed", "unchanged"):
        folder = tmp_path / model / "nq"
        folder.mkdir(parents=True)
        runs[(model, "nq")] = folder
        for reader, (record, _) in states.READERS.items():
            states.write_settings(folder / record, settings[reader])
    (tmp_path / "kept" / "nq" / "resid_ko.npy").write_bytes(b"")  # states still on disk
    (tmp_path / "kept" / "nq" / "resid_clean.npy").write_bytes(b"")
    (tmp_path / "kept" / "nq" / "resid_control.npy").write_bytes(b"")
    changed = {"probe_deltap": {"probe": {"C": 0.5}}, "pathway_experiments": {"probe": {"C": 1.0}}}
    both = {"probe_deltap": {"probe": {"C": 0.5}}, "pathway_experiments": {"probe": {"C": 0.5}}}
    # "unchanged" keeps its old record: it ran with the settings of `changed` already
    states.write_settings(tmp_path / "unchanged" / "nq" / "probe_settings.json", changed["probe_deltap"])
    found = states.reextractions(runs, changed)
    assert found == ["removed/nq (probe_deltap: pathways.probe.C)"]
    assert states.reextractions({("removed", "nq"): runs[("removed", "nq")]}, both) == [
        "removed/nq (probe_deltap: pathways.probe.C; pathway_experiments: pathways.probe.C)"
    ]
    message = states.reextraction_message(found)
    assert (
        "re-extracts them on the GPU for 1 run(s): removed/nq" in message and "keep_states: true" in message
    )
    assert states.reextraction_message([]) is None
    assert json.loads((tmp_path / "removed" / "nq" / "probe_settings.json").read_text()) == {
        "probe": {"C": 1.0}
    }
