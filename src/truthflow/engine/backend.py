"""Which attention kernel runs, for every forward pass of the engine (models load with `sdpa`). Since PyTorch
2.9, SDPA prefers cuDNN attention on Hopper and Blackwell, which plans every new shape anew (each batch, each
decoding step; benchmarks/README.md): `auto`, the default, leaves it out (flash without a 4D mask, efficient
with one, math last); `models.<name>.attention` overrides it. Saliency: eager attention (`gradient_mode`)."""

from contextlib import contextmanager, suppress

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..errors import TruthflowError

NAMES = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
         "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}  # fmt: skip
# the SDPA kernels each setting allows, in priority order
KERNELS = {
    choice: [NAMES[k] for k in order.split()]
    for choice, order in {"auto": "flash efficient math", "cudnn": "cudnn flash efficient math",
                          "flash": "flash math", "efficient": "efficient math", "math": "math"}.items()
}  # fmt: skip
KERNEL_NAME = {kernel: name for name, kernel in NAMES.items()}


def kernels(choice: str) -> list[SDPBackend]:
    if choice not in KERNELS:
        raise TruthflowError(f"attention '{choice}' is not one of {', '.join(KERNELS)}")
    return KERNELS[choice]


def attention(choice: str = "auto"):
    """A context in which SDPA runs the kernels `choice` allows, in its order."""
    return sdpa_kernel(kernels(choice), set_priority=True)


def kernel_that_runs(model, choice: str, masked: bool) -> str:
    """The kernel SDPA runs under `choice` for this model, 4D mask or not (each tried on a tiny input)."""
    text = model.config.get_text_config()
    dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    param = next(model.parameters())
    q = torch.zeros(1, text.num_attention_heads, 8, dim, dtype=param.dtype, device=param.device)
    mask = q.new_zeros(1, 1, 8, 8) if masked else None
    for kernel in kernels(choice):
        with suppress(RuntimeError), sdpa_kernel([kernel]), torch.no_grad():
            F.scaled_dot_product_attention(q, q, q, attn_mask=mask, is_causal=not masked)
            return KERNEL_NAME[kernel]
    return "none"


def describe(model, choice: str) -> str:
    """The log line of a model job: the implementation, the kernels allowed and those that run."""
    if (impl := getattr(model.config, "_attn_implementation", None)) != "sdpa":
        return f"attention: {impl} (transformers' own implementation)"
    allowed = " > ".join(KERNEL_NAME[k] for k in kernels(choice))
    return (
        f"attention: sdpa, setting '{choice}' (kernels {allowed}); a pass with a 4D mask runs "
        f"{kernel_that_runs(model, choice, True)}, one without {kernel_that_runs(model, choice, False)}"
    )


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
