"""Feed-forward networks (kind `ffn`). Bias-free, as in the paper's LLaMA-style blocks (Section 2.2)."""

import torch
from torch import nn

from ablate.core.contract import HIDDEN
from ablate.core.registry import register


def hidden_width(d_model: int, hidden_mult: float, multiple_of: int) -> int:
    """round(hidden_mult * d_model), rounded up to a multiple of `multiple_of`."""
    hidden = int(round(hidden_mult * d_model))
    return multiple_of * -(-hidden // multiple_of)


@register("ffn", "swiglu")
class SwiGLU(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x), hidden width 8/3 d_model (Section 2.2).

    Args:
        hidden_mult: hidden width as a multiple of d_model (default 8/3)
        multiple_of: the hidden width is rounded up to a multiple of this (LLaMA uses 256)
    """

    residual_out = ("w2.weight",)
    parameter_roles = dict.fromkeys(("w1.weight", "w3.weight", "w2.weight"), HIDDEN)  # width to width (μP)

    def __init__(self, *, d_model: int, hidden_mult: float = 8 / 3, multiple_of: int = 1):
        super().__init__()
        self.hidden = hidden_width(d_model, hidden_mult, multiple_of)
        self.w1 = nn.Linear(d_model, self.hidden, bias=False)
        self.w3 = nn.Linear(d_model, self.hidden, bias=False)
        self.w2 = nn.Linear(self.hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))

    def flops(self, seq_len: int) -> int:
        return 2 * seq_len * 3 * self.w1.in_features * self.hidden


@register("ffn", "gelu")
class GeluMLP(nn.Module):
    """GELU MLP: w2(gelu(w1 x)), hidden width 4 d_model (GPT-2 style, no bias).

    Args:
        hidden_mult: hidden width as a multiple of d_model (default 4)
        multiple_of: the hidden width is rounded up to a multiple of this (LLaMA uses 256)
    """

    residual_out = ("w2.weight",)
    parameter_roles = dict.fromkeys(("w1.weight", "w2.weight"), HIDDEN)

    def __init__(self, *, d_model: int, hidden_mult: float = 4.0, multiple_of: int = 1):
        super().__init__()
        self.hidden = hidden_width(d_model, hidden_mult, multiple_of)
        self.w1 = nn.Linear(d_model, self.hidden, bias=False)
        self.w2 = nn.Linear(self.hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.gelu(self.w1(x)))

    def flops(self, seq_len: int) -> int:
        return 2 * seq_len * 2 * self.w1.in_features * self.hidden
