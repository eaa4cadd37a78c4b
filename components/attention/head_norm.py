"""Per-head RMSNorm with a fixed output factor, as one autograd function (Eq. 3's `subln` and the
"+ GroupNorm" row of Table 6).

Computes exactly what `components.norm.RMSNorm` followed by `* factor` computes (statistics and the
weight product in float32, one rounding to the input dtype at the end), in fewer passes over memory:
the mean square is one float32-accumulating reduction of the input, the backward is written out
(dx = inv * (g - x̂ * mean(g * x̂)), g = dy * weight * factor) instead of autograd's chain through
float casts, pow, mean, rsqrt and three products. It saves the input (in its own dtype) and one float
per row, where autograd's chain keeps float32 copies. Measured in benchmarks/NOTES.md.
"""

from __future__ import annotations

import torch


def head_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, factor: float = 1.0) -> torch.Tensor:
    """x / rms(x) * weight * factor over the last dimension (statistics in float32), in x's dtype."""
    with torch.autocast(x.device.type, enabled=False):
        return _HeadRMSNorm.apply(x, weight, eps, factor)


def _inverse_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    width = x.shape[-1]
    norm = torch.linalg.vector_norm(
        x, dim=-1, keepdim=True, dtype=torch.promote_types(x.dtype, torch.float32)
    )
    return torch.rsqrt(norm.square_().div_(width).add_(eps))


class _HeadRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, factor):
        inv = _inverse_rms(x, eps)
        scaled = weight.to(inv.dtype) * factor
        out = (x * inv).mul_(scaled).to(x.dtype)
        ctx.save_for_backward(x, weight, inv)
        ctx.factor = factor
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, inv = ctx.saved_tensors
        normed = x * inv  # x̂, float32
        grad_weight = None
        if ctx.needs_input_grad[1]:
            rows = tuple(range(grad.dim() - 1))
            grad_weight = (grad * normed).sum(rows).mul_(ctx.factor).to(weight.dtype)
        g = grad * (weight.to(inv.dtype) * ctx.factor)  # float32
        mean = torch.linalg.vecdot(g, normed).unsqueeze(-1).div_(x.shape[-1])
        grad_x = torch.addcmul(g, normed, mean, value=-1).mul_(inv).to(x.dtype)
        return grad_x, grad_weight, None, None
