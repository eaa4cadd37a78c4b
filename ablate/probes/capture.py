"""How probes see inside a model: attention through the contract, hidden states through forward hooks.

`route_attention` makes every block's attention run `attend_with_maps` (ablate.core.contract) for the
duration of a `with`, handing each layer's maps to a callback and/or transforming its logits;
`block_outputs` hands each block's output (the residual stream after both residual additions) to a
callback. Both undo themselves on exit, also on errors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import torch
from torch import nn

from ablate.core.contract import AnalysableAttention, AttentionMaps, LogitTransform, causal_mask
from ablate.core.errors import UserError


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """Each block's attention module, checked to implement the analysis contract."""
    modules = [block.attention for block in model.blocks]
    for layer, module in enumerate(modules):
        if not isinstance(module, AnalysableAttention):
            name = getattr(module, "registry_name", type(module).__qualname__)
            raise UserError(
                f"eval.probes: attention {name!r} (layer {layer}) has no attend_with_maps "
                "(ablate.core.contract); probes read attention only through it: implement it to probe "
                "this variant"
            )
    return modules


@contextmanager
def route_attention(
    model: nn.Module,
    *,
    on_maps: Callable[[int, AttentionMaps], None] | None = None,
    logit_transform: LogitTransform | None = None,
) -> Iterator[None]:
    """Inside the `with`, block i's attention returns `attend_with_maps(x, logit_transform=...)[0]` and
    calls `on_maps(i, maps)`. With neither argument the model computes what its math backend computes."""
    modules = attention_modules(model)
    with ExitStack() as undo:
        for layer, module in enumerate(modules):
            undo.enter_context(
                _forward_replaced(module, _through_maps(module, layer, on_maps, logit_transform))
            )
        yield


def _through_maps(module: nn.Module, layer: int, on_maps, logit_transform):
    def forward(x: torch.Tensor) -> torch.Tensor:
        out, maps = module.attend_with_maps(x, logit_transform=logit_transform)
        if on_maps is not None:
            on_maps(layer, maps)
        return out

    return forward


@contextmanager
def _forward_replaced(module: nn.Module, forward: Callable) -> Iterator[None]:
    had = "forward" in module.__dict__  # an instance attribute shadows the class's method; keep one if set
    old = module.__dict__.get("forward")
    module.forward = forward
    try:
        yield
    finally:
        if had:
            module.forward = old
        else:
            del module.forward


@contextmanager
def block_outputs(model: nn.Module, on_output: Callable[[int, torch.Tensor], None]) -> Iterator[None]:
    """Inside the `with`, `on_output(i, y)` receives block i's output y (B, N, d_model): the residual
    stream after the block's attention and FFN residual additions (a forward hook on the block)."""
    handles = [block.register_forward_hook(_hook(i, on_output)) for i, block in enumerate(model.blocks)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _hook(layer: int, on_output):
    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        on_output(layer, output)

    return hook


def causal_entries(logits: torch.Tensor) -> torch.Tensor:
    """(B, H, N, N) -> (B, H, N(N+1)/2): the entries the causal mask keeps (key j <= query i)."""
    n = logits.shape[-1]
    return logits[..., causal_mask(n, logits.device)]
