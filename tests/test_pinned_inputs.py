"""Pinned inputs: a hub source resolves to a commit, recorded with its files' sha256, and a later run whose
unpinned source resolves elsewhere says so (the hub is faked: these tests never reach the network)."""

import copy
import hashlib
import json
from datetime import UTC, date, datetime
from pathlib import Path

import pytest
import yaml
from conftest import REPO, small_config

from truthflow import data, hub, models
from truthflow.config import check_sources
from truthflow.errors import TruthflowError
from truthflow.preflight import check_revision_values, prepare_config

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


# ------------------------------------------------------------ a revision given as a date
DAY = "2024-06-26"
# a faked commit history around DAY, newest first as the hub lists it: the last one on or before DAY (its end,
# UTC) is SAME_DAY_LATE; NEXT_DAY, a second later, is not
HISTORY = [
    ("e" * 40, datetime(2024, 7, 2, 9, 0, tzinfo=UTC)),
    ("d" * 40, datetime(2024, 6, 27, 0, 0, 0, tzinfo=UTC)),  # NEXT_DAY
    ("c" * 40, datetime(2024, 6, 26, 23, 59, 59, tzinfo=UTC)),  # SAME_DAY_LATE
    ("b" * 40, datetime(2024, 6, 26, 8, 0, tzinfo=UTC)),
    ("a" * 40, datetime(2024, 6, 20, 12, 0, tzinfo=UTC)),
]
SAME_DAY_LATE, NEXT_DAY = "c" * 40, "d" * 40
HEAD = HISTORY[0][0]


@pytest.fixture
def dated_hub(online, monkeypatch):
    """The hub calls a download makes, faked where truthflow calls them: HfApi().list_repo_commits (the
    history above), HfApi().model_info (a commit or a branch; anything else is no revision of the repo) and
    snapshot_download (a config.json). Returns the calls made, (name, revision)."""
    import huggingface_hub
    from huggingface_hub.hf_api import GitCommitInfo, ModelInfo

    calls = []

    def list_repo_commits(self, repo_id, *, repo_type=None, revision=None, **kwargs):
        calls.append(("list_repo_commits", revision))
        return [GitCommitInfo(sha, ["someone"], when, "update", "", None, None) for sha, when in HISTORY]

    def model_info(self, repo_id, *, revision=None, files_metadata=False, **kwargs):
        calls.append(("model_info", revision))
        sha = HEAD if revision in (None, "main") else revision
        if sha not in {s for s, _ in HISTORY}:
            raise ValueError(f"no revision {revision!r} of {repo_id}")  # the fake's RevisionNotFoundError
        lfs = {"sha256": sha[:1] * 64, "size": 3, "pointerSize": 130}
        return ModelInfo(id=repo_id, sha=sha, siblings=[{"rfilename": "model.safetensors", "lfs": lfs}])

    def snapshot_download(repo_id, revision=None, local_dir=None, allow_patterns=None):
        calls.append(("snapshot_download", revision))
        config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
        (Path(local_dir) / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 2}))
        return str(local_dir)

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_commits", list_repo_commits)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return calls


def test_a_date_resolves_to_the_last_commit_on_or_before_it(dated_hub):
    found = hub.resolve_revision("org/model", "model", DAY, "model 'm'")
    # by hand: 23:59:59 on the day is on it, 00:00:00 the next day is not
    assert found["revision"] == SAME_DAY_LATE != NEXT_DAY
    assert found["committed"] == "2024-06-26T23:59:59+00:00"
    assert found["files"] == {"model.safetensors": "c" * 64}  # the hub's sha256 at that commit
    assert dated_hub == [("list_repo_commits", None), ("model_info", SAME_DAY_LATE)]
    assert hub.resolve_revision("org/model", "model", "2024-06-25", "model 'm'")["revision"] == "a" * 40
    assert hub.resolve_revision("org/model", "model", "2024-06-27", "model 'm'")["revision"] == NEXT_DAY


def test_a_dated_model_records_date_and_commit_and_a_rerun_asks_the_hub_nothing(dated_hub, tmp_path):
    spec = {"source": {"hub": "org/model", "revision": DAY}}
    info = models.prepare_model("m", spec, tmp_path / "m")
    resolved = info["resolved"]
    assert resolved["requested"] == DAY and resolved["revision"] == SAME_DAY_LATE
    assert resolved["committed"] == "2024-06-26T23:59:59+00:00"
    # the inputs table's note: the date and when its commit was made (the table's revision column: the commit)
    made = "made 2024-06-26T23:59:59+00:00"
    assert resolved["note"] == f"hub snapshot: the last commit on or before {DAY} (UTC), {made}"
    assert ("snapshot_download", SAME_DAY_LATE) in dated_hub  # downloaded at the commit, never at the date
    dated_hub.clear()
    assert models.prepare_model("m", spec, tmp_path / "m")["resolved"] == resolved
    assert dated_hub == []  # the recorded snapshot is used: the date is not resolved again
    # nor does the check before a run ask: a date names one commit for good
    assert hub.changed_revisions([resolved | {"kind": "model", "name": "m"}]) == [] and dated_hub == []


@pytest.mark.parametrize("day", ["2024-06-19", "today"])
def test_a_date_with_no_commit_or_not_over_yet_is_one_line(dated_hub, tmp_path, day):
    day = datetime.now(UTC).date().isoformat() if day == "today" else day
    with pytest.raises(TruthflowError) as err:
        models.prepare_model("m", {"source": {"hub": "org/model", "revision": day}}, tmp_path / "m")
    line = str(err.value)
    assert "\n" not in line and line.startswith("model 'm': ") and line.count("model 'm'") == 1
    if day == "2024-06-19":
        assert "has no commit on or before 2024-06-19 (its first commit is of 2024-06-20)" in line
    else:
        assert f"revision {day} has not ended yet" in line
    assert not [c for c in dated_hub if c[0] == "snapshot_download"] and not (tmp_path / "m").exists()


def test_offline_a_date_is_one_line_and_the_cache_is_not_asked(dated_hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TruthflowError) as err:
        models.prepare_model("m", {"source": {"hub": "org/model", "revision": DAY}}, tmp_path / "m")
    assert "\n" not in str(err.value) and "model 'm'" in str(err.value) and "HF_HUB_OFFLINE" in str(err.value)
    assert dated_hub == []


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/1", "10.1.0", OLD, DAY, date(2024, 6, 26)])
def test_a_revision_may_be_a_commit_a_branch_or_tag_or_a_date(revision):
    cfg = {"models": {"m": {"source": {"hub": "org/model", "revision": revision}}}}
    check_sources(cfg)  # YAML's date made text
    check_revision_values(cfg)
    assert cfg["models"]["m"]["source"]["revision"] == (DAY if isinstance(revision, date) else revision)


@pytest.mark.parametrize(
    "revision", ["2024-02-30", "2024/06/26", "26-06-2024", "main branch", "a..b", "", "v1:2"]
)
@pytest.mark.parametrize("kind", ["models", "datasets"])
def test_a_malformed_revision_is_one_line_naming_its_key(revision, kind):
    cfg = {kind: {"x": {"source": {"hub": "org/x", "revision": revision}}}}
    with pytest.raises(TruthflowError) as err:
        check_revision_values(cfg)
    line = str(err.value)
    assert line.startswith(f"config key '{kind}.x.source.revision': {revision!r} is") and "\n" not in line


def test_the_workflow_checks_revisions_before_any_job(monkeypatch):
    """prepare_config, as the Snakefile calls it: an unquoted date (YAML's date) passes as text, a malformed
    revision is refused naming its key."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = small_config()
    name = next(iter(cfg["models"]))
    cfg["models"][name]["source"] = yaml.safe_load("{hub: org/model, revision: 2024-06-26}")
    assert prepare_config(copy.deepcopy(cfg), environ={})["models"][name]["source"]["revision"] == DAY
    cfg["models"][name]["source"]["revision"] = "2024-6-26"
    with pytest.raises(TruthflowError, match=rf"^config key 'models.{name}.source.revision': '2024-6-26' is"):
        prepare_config(cfg, environ={})


@pytest.mark.parametrize(
    ("config", "day"),
    # DepthQA: the authors' run (their repository's first commit and their judge batch); Two Pathways: the
    # paper's first arXiv submission (2601.07422v1)
    [("paper-depth.yaml", "2024-06-26"), ("paper-pathways.yaml", "2026-01-12")],
)
def test_the_paper_configs_pin_every_model_by_date(config, day):
    cfg = yaml.safe_load((REPO / "configs" / config).read_text())
    assert {name: m["source"].get("revision") for name, m in cfg["models"].items()} == dict.fromkeys(
        cfg["models"], day
    )
