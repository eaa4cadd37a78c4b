"""Normalisation layers (kind `norm`): the pre-norms of every block and the final norm."""

import torch
from torch import nn

from ablate.registry import register


@register("norm", "rmsnorm")
class RMSNorm(nn.Module):
    """RMSNorm (LLaMA, the paper's pre-norm): x / rms(x) * weight, statistics in float32."""

    def __init__(self, *, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x.dtype)


@register("norm", "layernorm")
class LayerNorm(nn.Module):
    """LayerNorm without bias (the bias-free pre-LN alternative)."""

    def __init__(self, *, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.layer_norm(x.float(), x.shape[-1:], self.weight.float(), None, self.eps).to(x.dtype)
