"""Pinned inputs: a hub source resolves to a commit, recorded with its files' sha256, and a later run whose
unpinned source resolves elsewhere says so (the hub is faked: these tests never reach the network)."""

import hashlib

import pytest

from truthflow import data, hub, models

OLD, NEW = "a" * 40, "b" * 40


@pytest.fixture
def online(monkeypatch):
    for name in hub.OFFLINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_a_hub_dataset_is_pinned_to_the_commit_it_resolves_to(online, monkeypatch):
    asked = []

    def resolve(repo, kind, revision, label):
        asked.append((repo, kind, revision))
        return {"revision": OLD, "files": {"test.parquet": "c" * 64}}

    monkeypatch.setattr(data, "resolve_revision", resolve)
    spec, record = data.resolve_source("nq", {"source": {"hub": "someone/nq", "split": "validation"}})
    assert asked == [("someone/nq", "dataset", None)] and spec["source"]["revision"] == OLD
    assert record == {
        "kind": "dataset",
        "name": "nq",
        "requested": None,
        "revision": OLD,
        "source": "someone/nq",
        "files": {"test.parquet": "c" * 64},
        "note": "hub",
    }


def test_a_local_dataset_records_its_files_digests(tmp_path):
    path = tmp_path / "nq.jsonl"
    path.write_text('{"question": "q", "answer": ["a"]}\n')
    _, record = data.resolve_source("nq", {"source": {"local": str(path)}})
    assert record["files"] == {"nq.jsonl": hashlib.sha256(path.read_bytes()).hexdigest()}
    assert record["revision"] is None


def test_a_hub_model_records_its_commit_and_files(online, monkeypatch, tmp_path):
    import huggingface_hub

    def snapshot(repo, revision, local_dir, allow_patterns):
        assert revision == OLD  # downloaded at the commit resolved, not at the moving branch
        (local_dir / "config.json").write_text("{}")

    monkeypatch.setattr(hub, "resolve_revision", lambda *a: {"revision": OLD, "files": {}})
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    resolved = models._hub_snapshot("org/model", None, tmp_path, "m")
    digest = hashlib.sha256(b"{}").hexdigest()
    assert resolved == {
        "source": "org/model",
        "requested": None,
        "revision": OLD,
        "files": {"config.json": digest},
        "note": "hub snapshot",
    }


def test_a_source_that_moved_is_named_with_both_commits(online, monkeypatch):
    monkeypatch.setattr(hub, "resolve_revision", lambda *a: {"revision": NEW, "files": {}})
    moved = {"kind": "dataset", "name": "nq", "source": "someone/nq", "requested": None, "revision": OLD}
    pinned = moved | {"name": "pinned", "requested": OLD}
    lines = hub.changed_revisions([moved, pinned, moved | {"name": "same", "revision": NEW}])
    assert len(lines) == 1 and "dataset 'nq'" in lines[0] and OLD in lines[0] and NEW in lines[0]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.changed_revisions([moved]) == []
