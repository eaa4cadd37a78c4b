"""Normalisation layers (kind `norm`): the pre-norms of every block and the final norm.

`rms_norm` is RMSNorm as one autograd function, shared by the pre-norms and the per-head norm of the
attention kinds (Eq. 3's `subln`, Table 6's "+ GroupNorm"): statistics and the weight product in
float32, one rounding to the input dtype at the end, as the formula written with float casts computes,
in fewer passes over memory. The mean square is one float32-accumulating reduction of the input; the
backward is written out (dx = inv * (g - x̂ * mean(g * x̂)), g = dy * weight * factor) instead of
autograd's chain through casts, pow, mean, rsqrt and three products. It saves the input in its own
dtype and one float per row, where autograd's chain keeps float32 copies. Measured in
benchmarks/NOTES.md.
"""

import torch
from torch import nn

from ablate.core.contract import VECTOR
from ablate.core.registry import register


@register("norm", "rmsnorm")
class RMSNorm(nn.Module):
    """RMSNorm (LLaMA, the paper's pre-norm): x / rms(x) * weight, statistics in float32.

    Args:
        eps: added to the mean square before the square root
    """

    parameter_roles = {"weight": VECTOR}  # a gain per channel (μP: ablate.core.contract)

    def __init__(self, *, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def flops(self, seq_len: int) -> int:
        """Element-wise work only, which the FLOPs convention leaves out (components/__init__.py)."""
        return 0


@register("norm", "layernorm")
class LayerNorm(nn.Module):
    """LayerNorm without bias (the bias-free pre-LN alternative).

    Args:
        eps: added to the variance before the square root
    """

    parameter_roles = {"weight": VECTOR}

    def __init__(self, *, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.layer_norm(x.float(), x.shape[-1:], self.weight.float(), None, self.eps).to(
            x.dtype
        )

    def flops(self, seq_len: int) -> int:
        """Element-wise work only, which the FLOPs convention leaves out (components/__init__.py)."""
        return 0


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, factor: float = 1.0) -> torch.Tensor:
    """x / rms(x) * weight * factor over the last dimension (statistics in float32), in x's dtype."""
    with torch.autocast(x.device.type, enabled=False):
        return _RMSNorm.apply(x, weight, eps, factor)


def _inverse_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    width = x.shape[-1]
    norm = torch.linalg.vector_norm(
        x, dim=-1, keepdim=True, dtype=torch.promote_types(x.dtype, torch.float32)
    )
    return torch.rsqrt(norm.square_().div_(width).add_(eps))


class _RMSNorm(torch.autograd.Function):
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
