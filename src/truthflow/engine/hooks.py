"""Forward hooks on a model, each a context manager that removes its hooks on leaving (an exception in a
pass leaves no hook behind): residual capture at one position per row with an early stop, a mask per
layer, the residual stream before the final norm."""

from collections.abc import Sequence
from contextlib import ExitStack, contextmanager
from functools import partial

import torch

from .masks import fold_window


class Stop(Exception):
    """Raised by a capture hook after the last layer a pass needs: layers above it cannot change it."""


def decoder_layers(model) -> Sequence[torch.nn.Module]:
    return getattr(model, model.base_model_prefix).layers


def final_norm(model):
    return getattr(getattr(model, model.base_model_prefix), "norm", None)


class _Hooks:
    handles: list

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    def __enter__(self):
        return self

    def __exit__(self, *_exc) -> None:
        self.remove()


class ResidCapture(_Hooks):
    """Keeps the residual stream after each decoder layer at one position per row, on the device; `stacked()`
    copies it to the host once per pass (a per-layer `.cpu()` syncs). stop_after = k: stop after layer k."""

    def __init__(self, layers: Sequence[torch.nn.Module], stop_after: int | None = None):
        self.positions: torch.Tensor | None = None
        self._rows: torch.Tensor | None = None
        self.resid_post: list[torch.Tensor | None] = [None] * len(layers)
        self.stop_after = stop_after
        self.active = True
        self.handles = [layer.register_forward_hook(partial(self._hook, i)) for i, layer in enumerate(layers)]

    def _hook(self, i: int, _mod, _args, output) -> None:
        if self.active and self.positions is not None:
            hidden = (output[0] if isinstance(output, tuple) else output).detach()  # [B, T, D]
            if self._rows is None or self._rows.device != hidden.device:
                self._rows = torch.arange(hidden.shape[0], device=hidden.device)
                self.positions = self.positions.to(hidden.device)
            self.resid_post[i] = hidden[self._rows, self.positions]  # [B, D], on the device
        if self.stop_after is not None and i == self.stop_after:
            raise Stop

    def set_positions(self, positions: list[int]) -> None:
        self.positions = torch.tensor(positions)
        self._rows = None

    @contextmanager
    def paused(self):
        """Within the block nothing is captured (a prefix cache's pass); the early stop still holds."""
        self.active = False
        try:
            yield
        finally:
            self.active = True

    def stacked(self) -> torch.Tensor:  # [B, L, D] float32 on the host: one device-to-host copy
        rows = [r for r in self.resid_post if r is not None]
        return torch.stack([r.to(rows[0].device) for r in rows], dim=1).float().cpu()


class LayerMasks(_Hooks):
    """Pre-hooks that give chosen decoder layers their own attention mask (per-layer knockout)."""

    def __init__(self, layers: Sequence[torch.nn.Module], windows: Sequence[int | None]):
        self.masks: dict[int, torch.Tensor] = {}
        self.windows = windows
        self.handles = [
            layer.register_forward_pre_hook(partial(self._hook, i), with_kwargs=True)
            for i, layer in enumerate(layers)
        ]

    def _hook(self, i: int, _mod, args, kwargs):
        if i in self.masks:
            kwargs["attention_mask"] = fold_window(self.masks[i], self.windows[i])
        return args, kwargs


@contextmanager
def unnormed(model):
    """Within the block, the base model's last_hidden_state is the residual stream before the final norm:
    the engine applies the norm itself, in float32 (`passes.float_logits`)."""
    with ExitStack() as undo:
        if (norm := final_norm(model)) is not None:
            undo.callback(norm.register_forward_hook(lambda _m, args, _out: args[0]).remove)
        yield
