"""How a local run shares its cores among model jobs. Imported by the Snakefile only (no rule's job imports
it), so editing it reruns nothing."""

from __future__ import annotations


def model_slots(gpus: int | None, gpu_machine: bool) -> int:
    """How many model jobs a local run holds at once: one per GPU given with `--resources gpu=K`; one on a
    machine with a GPU but no such count (jobs that see one device would share it); else two, each on half
    of the cores, so that one job's single-threaded phases (loading, tokenizing, writing) overlap the other's
    forward passes. On 2 cores (SmolLM2, 32 x 60 tokens): one 2-thread pass 3.4 s, two 1-thread passes at
    once 6.2 and 6.5 s: no compute lost."""
    if gpus:
        return int(gpus)
    return 1 if gpu_machine else 2


def model_threads(cores: int | None, slots: int, default: int = 8) -> int:
    """Snakemake threads a model job claims in a local run of `--cores`: fewer than its slot's share where
    that leaves at least one core unclaimed while still fitting only `slots` model jobs (the demo's --cores
    8: 3 + 3, not 4 + 4); else the share. The one-thread jobs go first (PRIORITY in the rules); with claims of
    the whole share, one of them in a freed slot held the next model job back until it ended (10-17 s a time
    in a demo run). `default` where the run gives no core count (a cluster run: profiles set theirs with
    set-threads)."""
    if not cores:
        return default
    slots = max(1, slots)
    claim = (cores - 1) // slots
    return claim if claim * (slots + 1) > cores else max(1, -(-cores // slots))


def torch_threads(cores: int | None, slots: int, cpus: int) -> int:
    """torch threads for a model job of a local run of `cores` that holds one of `slots` model slots: its
    share of the machine's `cpus`, never more than its share of the cores (two jobs with a thread per CPU
    each would both run ~10x slower); 0 where the run gives no core count (a cluster job: it uses its own
    `threads`). The share, not the claim (`model_threads`): the one-thread jobs that the claim leaves room
    for are short, and a model job keeps its cores while none runs."""
    if not cores:
        return 0
    share = max(1, -(-cores // max(1, slots)))
    return max(1, min(share, cpus * share // cores))
