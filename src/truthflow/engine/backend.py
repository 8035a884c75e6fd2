"""Which attention runs, for every forward pass of the engine. Models load with the implementation the setting
names (`implementation`: `sdpa`, or `eager`); under SDPA the setting picks the kernels. Since PyTorch 2.9,
SDPA prefers cuDNN attention on Hopper and Blackwell, which plans every new shape anew (each batch, each
decoding step; benchmarks/README.md): `auto`, the default, leaves it out (flash without a mask, efficient with
one, math last); `models.<name>.attention` overrides it. Saliency: eager attention (`gradient_mode`).

What runs is read, not predicted: `probe` runs the model itself on the four kinds of pass the engine makes
(`CASES`: no padding, a padded batch, an additive 4D mask, a one-token decoding step) under torch.profiler
and names the SDPA kernel each called and how grouped-query heads reached it; `describe` logs that at load.
The tests and benchmarks/gpu_check.py read the engine's real passes with the same profiler helpers."""

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile, record_function

from ..errors import TruthflowError

NAMES = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
KERNEL_NAME = {kernel: name for name, kernel in NAMES.items()}
# the SDPA kernels each setting allows, in priority order; `eager` runs transformers' own attention, no SDPA
PRIORITY = {
    "auto": "flash efficient math",
    "cudnn": "cudnn flash efficient math",
    "flash": "flash math",
    "efficient": "efficient math",
    "math": "math",
    "eager": "",
}
KERNELS = {choice: [NAMES[k] for k in order.split()] for choice, order in PRIORITY.items()}

# the kernel an SDPA call ran, by the aten op the profiler records under aten::scaled_dot_product_attention
SDPA_OP = "aten::scaled_dot_product_attention"
KERNEL_OPS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
}
# the kinds of pass the engine makes, as `probe` runs them
CASES = ("pass without padding", "padded batch", "pass with a 4D mask", "one-token decode step")
PROBE_TOKENS = 8


def kernels(choice: str) -> list[SDPBackend]:
    if choice not in KERNELS:
        raise TruthflowError(f"attention '{choice}' is not one of {', '.join(KERNELS)}")
    return KERNELS[choice]


def implementation(choice: str) -> str:
    """The attn_implementation a model loads with under the setting `choice`."""
    return "sdpa" if kernels(choice) else "eager"


def attention(choice: str = "auto"):
    """A context in which SDPA runs the kernels `choice` allows, in its order."""
    allowed = kernels(choice)
    return sdpa_kernel(allowed, set_priority=True) if allowed else nullcontext()


# ------------------------------------------------------------------ reading what ran
@contextmanager
def profiled(cuda: bool | None = None) -> Iterator[profile]:
    """torch.profiler over the block: host ops with their input shapes, and with `cuda` (default: a CUDA
    device is available) the device's kernels."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities, record_shapes=True) as prof:
        yield prof
        if cuda:
            torch.cuda.synchronize()


def _events(prof: profile):
    """The profiler's raw events (kineto's own records): parsing them into FunctionEvents, as
    `prof.events()` does, takes seconds for the tens of thousands of ops of a large model's passes."""
    return prof.profiler.kineto_results.events()


def sdpa_calls(prof: profile, within: str | None = None) -> list[tuple[str, list]]:
    """(kernel, [query shape, key shape]) of each SDPA call the profiler saw, in order; within: only the
    calls inside the `record_function` range of that name."""
    wanted = {SDPA_OP, *KERNEL_OPS, within}
    events = sorted((e for e in _events(prof) if e.name() in wanted), key=lambda e: e.start_ns())
    if within is not None:
        ranges = [(e.start_ns(), e.end_ns()) for e in events if e.name() == within]
        events = [e for e in events if any(start <= e.start_ns() <= end for start, end in ranges)]
    outer = [e.shapes()[:2] for e in events if e.name() == SDPA_OP]
    inner = [KERNEL_OPS[e.name()] for e in events if e.name() in KERNEL_OPS]
    if len(inner) != len(outer):  # a kernel op this table lacks (a new backend): named as such
        inner = [*inner, *["unknown"] * (len(outer) - len(inner))][: len(outer)]
    return list(zip(inner, outer, strict=True))


def device_kernels(prof: profile) -> list[str]:
    """The names of the device kernels (CUDA) the profiler saw; none on a CPU."""
    cpu = torch.autograd.DeviceType.CPU
    return sorted({e.name() for e in _events(prof) if e.device_type() != cpu})


def cudnn_attention(prof: profile) -> list[str]:
    """The cuDNN attention that ran: SDPA calls that chose it, and device kernels of cuDNN's."""
    calls = [f"sdpa call {n}: cudnn" for n, (kernel, _) in enumerate(sdpa_calls(prof)) if kernel == "cudnn"]
    return calls + [name for name in device_kernels(prof) if "cudnn" in name.lower()]


def gqa_route(text_config, shapes: list) -> str:
    """How grouped-query heads reached the kernel, from an SDPA call's [query, key] shapes."""
    heads, kv_heads = text_config.num_attention_heads, getattr(text_config, "num_key_value_heads", None)
    if not kv_heads or kv_heads == heads:
        return "no GQA"
    q_heads, k_heads = shapes[0][1], shapes[1][1]
    if q_heads > k_heads:
        return "GQA in the kernel"
    return "query packed to the KV heads" if q_heads == kv_heads else "keys repeated to every head"


# ------------------------------------------------------------------ the probe at load
def _probe_passes(model) -> Iterator[str]:
    """Runs the four kinds of pass on a tiny batch, each in a record_function range named by its case."""
    from transformers import DynamicCache

    from .masks import attention_mask, model_mask

    text = model.config.get_text_config()
    device = model.get_input_embeddings().weight.device
    n = PROBE_TOKENS
    ids = (torch.arange(2 * n, device=device).view(2, n) % max(text.vocab_size - 3, 1)) + 3
    lengths = torch.tensor([[n], [n // 2]], device=device)
    right = torch.arange(n, device=device)[None] < lengths  # [2, n] real tokens, right-padded
    left = right.flip(1)  # generation pads on the left
    dtype = next(model.parameters()).dtype
    passes = {
        "pass without padding": lambda: model(input_ids=ids[:1]),
        "padded batch": lambda: model(input_ids=ids, attention_mask=right.long()),
        "pass with a 4D mask": lambda: model(
            input_ids=ids, attention_mask=model_mask(model.config, attention_mask(right, None, dtype))
        ),
    }
    for case, run in passes.items():
        with record_function(case):
            run()
        yield case
    cache = DynamicCache(config=model.config)
    model(input_ids=ids, attention_mask=left.long(), past_key_values=cache, use_cache=True)
    with record_function("one-token decode step"):
        step_valid = torch.cat([left, torch.ones(2, 1, dtype=torch.bool, device=device)], 1)
        model(input_ids=ids[:, -1:], attention_mask=step_valid.long(), past_key_values=cache, use_cache=True)
    yield "one-token decode step"


def probe(model, choice: str) -> dict[str, tuple[str, str]]:
    """{case: (the SDPA kernel it ran, how GQA reached it)} of each kind of pass (`CASES`), under `choice`;
    ("none", "") where no SDPA call ran (eager attention)."""
    text = model.config.get_text_config()
    on_cuda = model.get_input_embeddings().weight.device.type == "cuda"
    with profiled(on_cuda) as prof, attention(choice), torch.inference_mode():
        cases = list(_probe_passes(model))
    found = {}
    for case in cases:
        calls = sdpa_calls(prof, within=case)
        kernels_run = sorted({kernel for kernel, _ in calls})
        found[case] = ("/".join(kernels_run), gqa_route(text, calls[0][1])) if calls else ("none", "")
    return found


def kernel_that_runs(model, choice: str, masked: bool) -> str:
    """The kernel SDPA runs under `choice` for a pass with an additive 4D mask, or one without any mask."""
    return probe(model, choice)["pass with a 4D mask" if masked else "pass without padding"][0]


def describe(model, choice: str) -> str:
    """The load log's line: the implementation, the kernels allowed and the one each kind of pass runs."""
    if (impl := getattr(model.config, "_attn_implementation", None)) != "sdpa":
        return f"attention: {impl} (transformers' own implementation; setting '{choice}')"
    allowed = " > ".join(KERNEL_NAME[k] for k in kernels(choice))
    runs = "; ".join(
        f"a {case} runs {kernel} ({gqa})" if gqa else f"a {case} runs {kernel}"
        for case, (kernel, gqa) in probe(model, choice).items()
    )
    return f"attention: sdpa, setting '{choice}' (kernels {allowed}); {runs}"


@contextmanager
def gradient_mode(model):
    """Within the block, eager attention and frozen parameters; the model's implementation, flags restored."""
    before = model.config._attn_implementation
    flags = [(p, p.requires_grad) for p in model.parameters()]
    model.set_attn_implementation("eager")
    try:
        if getattr(model.config, "_attn_implementation", None) != "eager":
            raise TruthflowError(
                f"saliency needs eager attention; {type(model).__name__} could not be switched from "
                f"'{before}' to 'eager': load the model with attn_implementation='eager'"
            )
        model.requires_grad_(False)
        yield
    finally:
        model.set_attn_implementation(before)
        for p, flag in flags:
            p.requires_grad_(flag)
