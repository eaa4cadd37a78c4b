"""Building an attention component the way a block does, and one fp32 forward/backward beside float64
leaf copies for an independent reference to run on: shared by the attention tests in tests/components
(pytest puts tests/ on the path, pyproject's `pythonpath`)."""

from __future__ import annotations

import torch

from ablate.core.registry import build


def build_attention(
    spec: dict,
    d_model: int,
    head_dim: int,
    *,
    layer_idx: int,
    n_layers: int,
    position="rope",
    backend="math",
    seed=0,
):
    """The attention `spec` built under `model.attention` with the block's arguments, after seeding torch."""
    torch.manual_seed(seed)
    return build(
        "attention",
        spec,
        key="model.attention",
        d_model=d_model,
        head_dim=head_dim,
        layer_idx=layer_idx,
        n_layers=n_layers,
        position=position,
        backend=backend,
    )


def run_fp32(module, x: torch.Tensor, g: torch.Tensor):
    """module(x) in fp32 with (out * g).sum() backpropagated, and float64 leaf copies of x and of every
    parameter for a reference: (out, x32, x64, params64); x32.grad and each parameter's .grad are filled."""
    x32 = x.clone().requires_grad_()
    out = module(x32)
    (out * g).sum().backward()
    params = {n: t.detach().double().requires_grad_() for n, t in module.named_parameters()}
    return out, x32, x.double().requires_grad_(), params
