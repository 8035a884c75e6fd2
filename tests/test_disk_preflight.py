"""The disk preflight: a run whose planned peak disk exceeds the free space is refused before any job, with
one line naming what it needs, what is free and the settings that cut it; disk.check: false skips it."""

import copy
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
import yaml

from truthflow import diskplan, pricing
from truthflow.errors import TruthflowError
from truthflow.preflight import check_disk, disk_refusal, free_space, prepare_config

REPO = Path(__file__).resolve().parents[1]
GB = 10**9
Usage = namedtuple("Usage", "total used free")
Plan = namedtuple("Plan", "peak_bytes weights_bytes activation_peak_bytes gpu_slots")


@pytest.fixture(scope="module")
def paper():
    config = yaml.safe_load((REPO / "configs" / "paper-pathways.yaml").read_text())
    return prepare_config(config, environ={})


def test_refusal_by_hand():
    """new weights 10 GB + states 20 GB at the peak, 20 GB free: 30 GB needed, refused; 30 GB free fits."""
    config = {"pathways": {"models": ["m"], "keep_states": True}}
    plan = Plan(peak_bytes=30 * GB, weights_bytes=10 * GB, activation_peak_bytes=20 * GB, gpu_slots=1)
    line = disk_refusal(config, plan, {"resources": 20 * GB})
    assert line.startswith("the run needs 30 GB of disk at its peak in resources/ (new weights 10 GB")
    assert "20 GB free" in line and "pathways.keep_states: false" in line and "disk.check: false" in line
    assert "fewer GPUs at once" not in line  # one GPU: no cut there
    assert disk_refusal(config, plan, {"resources": 30 * GB}) is None  # just fits
    # two filesystems: the weights fit in resources/, the 20 GB of states do not fit in 19 GB of results/
    split = disk_refusal(config, plan, {"resources": 10 * GB, "results": 19 * GB})
    assert "needs 20 GB of disk at its peak in results/" in split and "19 GB free" in split
    assert disk_refusal(config, plan, {"resources": 10 * GB, "results": 20 * GB}) is None
    four = disk_refusal(config, plan._replace(gpu_slots=4), {"resources": 20 * GB})
    assert "fewer GPUs at once (planned: 4; a profile's resources: gpu=N)" in four


def test_paper_run_refused_on_a_small_disk_and_passed_with_the_setting(paper, monkeypatch, tmp_path):
    """paper-pathways with every state kept (1.2 TB planned) on a faked 500 GB disk: one line, before any job;
    disk.check: false lets it through; with the paper's own setting (states removed) it needs far less."""
    kept = copy.deepcopy(paper)
    kept["pathways"]["keep_states"] = True
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**15, 0, 500 * GB))
    plan = diskplan.plan(kept)
    with pytest.raises(TruthflowError) as refused:
        check_disk(kept, plan, free_space(kept, root=tmp_path))
    message = str(refused.value)
    assert "\n" not in message and "500 GB free" in message and "pathways.keep_states: false" in message
    assert f"needs {plan.peak_bytes / GB:,.0f} GB of disk at its peak in results/ and resources/" in message
    assert plan.peak_bytes > 1_000 * GB
    skipped = copy.deepcopy(kept)
    skipped["disk"]["check"] = False
    check_disk(skipped, plan, free_space(skipped, root=tmp_path))  # no exception
    removed = diskplan.plan(paper)
    assert removed.peak_bytes < plan.peak_bytes - 500 * GB


def test_a_quota_setting_replaces_the_filesystems_free_space(paper, monkeypatch, tmp_path):
    """disk.free_gb: 100 on a filesystem with 10 TB free: 100 GB is what the plan is held against."""
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**15, 0, 10_000 * GB))
    quota = copy.deepcopy(paper)
    quota["disk"]["free_gb"] = 100
    assert free_space(quota, root=tmp_path) == {"results/ and resources": 100 * GB}
    assert free_space(paper, root=tmp_path) == {"results/ and resources": 10_000 * GB}
    with pytest.raises(TruthflowError, match="100 GB free"):
        check_disk(quota, diskplan.plan(quota), free_space(quota, root=tmp_path))


def test_only_this_configs_weights_and_unfinished_jobs_count(paper):
    """A prepared model of the config writes no weights (Llama-3-70B: 70,553,706,496 params x 2 bytes); a name
    the config does not use changes nothing; a finished run's jobs write nothing new."""
    full = diskplan.plan(paper)
    unrelated = diskplan.plan(paper, prepared={"some-other-model"})
    assert (unrelated.peak_bytes, unrelated.weights_bytes) == (full.peak_bytes, full.weights_bytes)
    seventy = diskplan.plan(paper, prepared={"llama-3-70b"})
    assert full.weights_bytes - seventy.weights_bytes == 70_553_706_496 * 2
    every_job = {job.key for job in diskplan.jobs(paper, {})}
    every_model = set(paper["pathways"]["models"])
    finished = diskplan.plan(paper, done=every_job, prepared=every_model)
    assert (finished.peak_bytes, finished.weights_bytes, finished.activation_peak_bytes) == (0, 0, 0)


def profile_gpus() -> int:
    """The GPUs profiles/slurm lets a run hold at once (its `resources: gpu=N`)."""
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    return int(next(r.split("=")[1] for r in profile["resources"] if r.startswith("gpu=")))


def test_a_cluster_is_planned_at_its_worst_concurrency(paper):
    """The largest peak over 1 to K GPUs at once, and not K's alone: the peak does not grow steadily."""
    seconds = pricing.job_seconds(paper)
    peaks = {k: diskplan.plan(paper, k, seconds).peak_bytes for k in range(1, 5)}
    worst = diskplan.worst_plan(paper, 4, seconds=seconds)
    assert worst.peak_bytes == max(peaks.values()) and peaks[worst.gpu_slots] == worst.peak_bytes
    assert worst.max_slots == 4 and "the largest peak over 1-4 GPUs at once" in worst.line()
    assert diskplan.plan(paper, 1, seconds).peak_bytes < worst.peak_bytes
    # issue 47's goal: paper-pathways at profiles/slurm's concurrency stays within 650 GB, weights included
    assert diskplan.worst_plan(paper, profile_gpus(), seconds=seconds).peak_bytes <= 650 * GB


# --- the preflight as Snakemake runs it (a dry run prints it, a real run refuses before its first job) ---


def _plan_line(proc) -> str:
    lines = [
        line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("truthflow: disk plan")
    ]
    assert len(lines) == 1, (proc.stdout + proc.stderr)[-3000:]
    return lines[0]


@pytest.mark.workflow
def test_dry_run_prints_the_refusal(tmp_path):
    """A fresh run with 1 MB to write: the dry run prints the plan and the refusal the real run gives, and
    exits 0; the real run stops before any job with that refusal. A 500 GB file of a model this config does
    not use, under resources/models, is not counted as the run's own."""
    from conftest import small_config, snakemake, write_config

    write_config(tmp_path, small_config(disk={"check": True, "free_gb": 0.001}))
    unrelated = tmp_path / "resources" / "models" / "unrelated-70b" / "model.safetensors"
    unrelated.parent.mkdir(parents=True)
    with unrelated.open("wb") as handle:  # sparse: no real disk
        handle.truncate(500 * GB)
    dry = snakemake(tmp_path, "-n")
    assert dry.returncode == 0, dry.stderr[-3000:]
    line = _plan_line(dry)
    assert "0 GB free in results/ and resources/: the run would be refused: the run needs 2 GB" in line, line
    assert "new weights 2 GB" in line
    real = snakemake(tmp_path)
    assert real.returncode != 0 and "the run needs 2 GB of disk at its peak" in real.stderr
    assert (
        not (tmp_path / "results").exists()
        and not (tmp_path / "resources" / "models" / "smollm2-135m").exists()
    )


@pytest.mark.workflow
def test_a_login_node_without_gpus_plans_the_profiles_concurrency(tmp_path):
    """No GPU here (CUDA_VISIBLE_DEVICES empty), profiles/slurm's 20 jobs and its GPU cap: the plan is the
    worst case over 1 to that many GPUs at once, not one job at a time."""
    from conftest import REPO as CHECKOUT
    from conftest import small_config, snakemake, write_config

    write_config(tmp_path, small_config())
    profile = str(CHECKOUT / "profiles" / "slurm")
    dry = snakemake(tmp_path, "-n", "--profile", profile, extra_env={"CUDA_VISIBLE_DEVICES": ""})
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert f"the largest peak over 1-{profile_gpus()} GPUs at once" in _plan_line(dry)
    local = snakemake(tmp_path, "-n", extra_env={"CUDA_VISIBLE_DEVICES": ""})
    assert "1 GPU slot(s)" in _plan_line(local)


@pytest.mark.workflow
def test_a_redraw_needs_no_disk(pristine_run, tmp_path):
    """A finished run that redraws one plot writes no new large file: with 0 GB to write it plans 0 GB and
    runs."""
    from conftest import copy_run, snakemake

    workdir = copy_run(pristine_run, tmp_path)
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    config["disk"] = {"check": True, "free_gb": 0}
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    redraw = snakemake(workdir, "--forcerun", "plot_depth")
    assert redraw.returncode == 0, redraw.stderr[-3000:]
    assert "rule plot_depth:" in redraw.stdout + redraw.stderr
    dry = snakemake(workdir, "-n", "--forcerun", "plot_depth")
    assert "peak disk 0 GB (weights 0 GB" in _plan_line(dry) and "it fits" in _plan_line(dry)


def test_two_configs_in_one_checkout(paper):
    """Both paper configs, one after the other: each leaves its weights and final files, and the one model
    name they share (llama-3-8b-instruct) is prepared once: held = final(pathways) + final(depth) - its
    weights."""
    depth = pricing.prepared(pricing.PAPER_CONFIGS[1])
    plans = [(paper, diskplan.plan(paper)), (depth, diskplan.plan(depth))]
    shared = diskplan.weights_bytes("llama-3-8b-instruct", depth["models"]["llama-3-8b-instruct"])
    both = diskplan.together(plans)
    assert both["held"] == plans[0][1].final_bytes + plans[1][1].final_bytes - shared
    # the second run's peak: everything the first holds, plus its new weights and its activation files
    depth_new = plans[1][1].weights_bytes - shared + plans[1][1].activation_peak_bytes
    assert both["peak"] == max(plans[0][1].peak_bytes, plans[0][1].final_bytes + depth_new)
    assert both["peak"] > max(p.peak_bytes for _, p in plans)  # more than either config alone
