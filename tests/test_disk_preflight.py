"""The disk preflight: a run whose planned peak disk exceeds the free space is refused before any job, with
one line naming what it needs, what is free and the settings that cut it; disk.check: false skips it."""

import copy
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
import yaml

from truthflow import diskplan
from truthflow.errors import TruthflowError
from truthflow.preflight import check_disk, disk_refusal, prepare_config

REPO = Path(__file__).resolve().parents[1]
GB = 10**9
Usage = namedtuple("Usage", "total used free")
Plan = namedtuple("Plan", "peak_bytes weights_bytes activation_peak_bytes")


@pytest.fixture(scope="module")
def paper():
    config = yaml.safe_load((REPO / "configs" / "paper-pathways.yaml").read_text())
    return prepare_config(config, environ={})


def test_refusal_by_hand():
    """weights 10 GB + states 20 GB at the peak, 5 GB of it already written, 20 GB free: 25 GB needed."""
    config = {"pathways": {"models": ["m"], "keep_states": True}}
    plan = Plan(peak_bytes=30 * GB, weights_bytes=10 * GB, activation_peak_bytes=20 * GB)
    line = disk_refusal(config, plan, {"resources": 20 * GB}, {"resources": 5 * GB})
    assert line.startswith("the run needs 25 GB of disk at its peak in resources/ (weights 10 GB")
    assert "20 GB free" in line and "pathways.keep_states: false" in line and "disk.check: false" in line
    assert disk_refusal(config, plan, {"resources": 25 * GB}, {"resources": 5 * GB}) is None  # just fits
    # two filesystems: the weights fit in resources/, the 20 GB of states do not fit in 19 GB of results/
    split = disk_refusal(config, plan, {"resources": 10 * GB, "results": 19 * GB}, {})
    assert "needs 20 GB of disk at its peak in results/" in split and "19 GB free" in split
    assert disk_refusal(config, plan, {"resources": 10 * GB, "results": 20 * GB}, {}) is None


def test_paper_run_refused_on_a_small_disk_and_passed_with_the_setting(paper, monkeypatch, tmp_path):
    """paper-pathways with every state kept (1.2 TB planned) on a faked 500 GB disk: one line, before any job;
    disk.check: false lets it through; with the paper's own setting (states removed) it needs far less."""
    kept = copy.deepcopy(paper)
    kept["pathways"]["keep_states"] = True
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**15, 0, 500 * GB))
    plan = diskplan.plan(kept)
    with pytest.raises(TruthflowError) as refused:
        check_disk(kept, plan, root=tmp_path)
    message = str(refused.value)
    assert "\n" not in message and "500 GB free" in message and "pathways.keep_states: false" in message
    assert f"needs {plan.peak_bytes / GB:,.0f} GB of disk at its peak in results/ and resources/" in message
    assert plan.peak_bytes > 1_000 * GB
    skipped = copy.deepcopy(kept)
    skipped["disk"]["check"] = False
    check_disk(skipped, plan, root=tmp_path)  # no exception
    removed = diskplan.plan(paper)
    assert removed.peak_bytes < plan.peak_bytes - 500 * GB
