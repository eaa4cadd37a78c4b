"""The outputs inside a `DecoderLM` that per-layer measurements read, through forward hooks that remove
themselves.

`layer_outputs(model)` names the modules whose outputs are read: `embed` (the token embeddings, the
residual stream entering block 0) and, per block NN, `layer_NN.attention` (what its attention adds to the
residual stream), `layer_NN.ffn` (what its FFN adds) and `layer_NN.residual` (the block itself: the
residual stream after it). `outputs_into` keeps what each forward of such modules gives, for the duration
of a `with`. Used by the coordinate check (ablate.train.coord) and the per-layer statistics of a run
(ablate.train.layer_stats).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn


def layer_outputs(model: nn.Module) -> dict[str, nn.Module]:
    """The named modules of the module doc, in the order the forward reaches them."""
    modules = {"embed": model.embed}
    for i, block in enumerate(model.blocks):
        modules[f"layer_{i:02d}.attention"] = block.attention
        modules[f"layer_{i:02d}.ffn"] = block.ffn
        modules[f"layer_{i:02d}.residual"] = block
    return modules


@contextlib.contextmanager
def outputs_into(
    out: dict[str, Any], modules: Mapping[str, nn.Module], keep: Callable[[torch.Tensor], Any]
) -> Iterator[None]:
    """Inside the `with`, every forward of `modules[key]` sets `out[key] = keep(its output)`; the hooks are
    removed on exit, also on errors."""

    def hook(key: str) -> Callable[..., None]:
        def record(module: nn.Module, inputs: object, output: torch.Tensor) -> None:
            out[key] = keep(output)

        return record

    handles = [module.register_forward_hook(hook(key)) for key, module in modules.items()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
