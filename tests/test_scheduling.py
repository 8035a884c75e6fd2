"""How a local run shares its cores among model jobs (truthflow.scheduling, used by the Snakefile)."""

import pytest

from truthflow.scheduling import model_slots, model_threads, torch_threads, visible_gpus


def test_model_slots():
    assert model_slots(0) == 2  # CPU: two jobs overlap each other's loading
    assert model_slots(1) == 1  # one GPU: never shared
    assert model_slots(3) == 3  # one job per visible GPU


def test_visible_gpus_are_the_device_nodes_cuda_visible_devices_lists(tmp_path):
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert visible_gpus({}, tmp_path) == 3  # nvidiactl and nvidia-uvm are no GPUs
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,0"}, tmp_path) == 2
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, tmp_path) == 0
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, tmp_path) == 3  # no more than the machine has
    assert visible_gpus({}, tmp_path / "absent") == 0


@pytest.mark.parametrize(
    "cores,slots,expected",
    [(8, 2, 4), (16, 2, 8), (2, 2, 1), (1, 2, 1), (3, 2, 2), (16, 4, 4), (None, 2, 8)],
)
def test_model_threads(cores, slots, expected):
    assert model_threads(cores, slots) == expected


@pytest.mark.parametrize(
    "threads,cores,cpus,expected",
    [
        (4, 8, 2, 1),  # the demo: --cores 8 on this 2-CPU machine, two jobs of 4 threads: one torch thread
        (8, 16, 16, 8),  # --cores 16 on 16 CPUs, two jobs: half each
        (8, 16, 64, 8),  # never more than the job's threads
        (1, 1, 2, 1),
        (2, 3, 2, 1),  # 2 * 2 // 3 = 1
        (8, None, 64, 0),  # a cluster job: 0, it uses its own threads
    ],
)
def test_torch_threads(threads, cores, cpus, expected):
    assert torch_threads(threads, cores, cpus) == expected


def test_two_demo_model_jobs_never_oversubscribe():
    """On any machine, the demo's --cores 8 gives model jobs torch threads that sum to at most the CPUs
    (when the CPUs are at least the jobs), so two concurrent jobs never fight over cores."""
    for cpus in (1, 2, 3, 4, 8, 16, 64):
        slots = model_slots(0)
        threads = model_threads(8, slots)
        concurrent = 8 // threads
        assert concurrent * torch_threads(threads, 8, cpus) <= max(cpus, concurrent)


@pytest.mark.workflow
def test_model_jobs_get_their_share_in_a_real_dry_run(tmp_path):
    """The one real dry run of this family: the Snakefile reads --cores off Snakemake (on a CPU machine two
    model jobs at once: 16 // 2 = 8 threads; `--resources gpu=2` as a GPU run passes it) and hands the job its
    torch threads. The other cases (one job per visible GPU) are the hand cases above."""
    import re

    from conftest import small_config, snakemake, write_config

    write_config(tmp_path, small_config())
    no_gpu = {"CUDA_VISIBLE_DEVICES": ""}  # a CPU machine's share, on a GPU machine too
    proc = snakemake(tmp_path, "-n", "--cores", "16", "--resources", "gpu=2", timeout=300, extra_env=no_gpu)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    block = out[out.index("rule generate_answers:") :]
    block = block[: block.index("\n\n")]
    assert re.search(r"^\s+threads: 8$", block, re.M), block
    assert re.search(r"torch_threads=\d+", block), block


LOG = """Execute 1 jobs...
rule generate_answers:
    output: results/demo/answers/m/nq.parquet
    jobid: 7
    wildcards: model=m, dataset=nq
Execute 1 jobs...
rule generate_answers:
    jobid: 8
    wildcards: model=m, dataset=hotpotqa
Finished jobid: 7 (Rule: generate_answers)
{between}Execute 1 jobs...
localrule label_answers:
    jobid: 3
    wildcards: model=m, dataset=nq
Finished jobid: 3 (Rule: label_answers)
"""
# a round after the answers' end that started another model job instead of the label
PASSED_OVER = """Execute 1 jobs...
rule extract_pathways:
    jobid: 9
    wildcards: model=m, dataset=nq
"""


@pytest.mark.parametrize("between,late", [("", []), (PASSED_OVER, [("model=m, dataset=nq", 1)])])
def test_a_step_that_waited_for_a_core_is_reported(tmp_path, between, late):
    """The negative control of test_workflow.py's order check, on a hand-written Snakemake log: a label job
    started by the first round after its answers are written passes; one that a round passed over, starting
    a model job instead, is reported."""
    from test_workflow import _job_rounds, late_steps

    log = tmp_path / "run.snakemake.log"
    log.write_text(LOG.format(between=between))
    assert late_steps(_job_rounds(log), "label_answers", "generate_answers") == (1, late)
