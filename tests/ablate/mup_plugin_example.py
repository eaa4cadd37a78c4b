"""Two third-party norms that μP cannot take, as a user might write them (tests/ablate/test_mup_check.py
imports this module through a recipe's `imports:`): one with a parameter whose role it does not declare,
one that refuses widths below 32 (so a μP base narrower than that cannot be built)."""

from __future__ import annotations

import torch
from torch import nn

from ablate.core.contract import VECTOR
from ablate.core.registry import register


@register("norm", "test_unroled_norm")
class UnroledNorm(nn.Module):
    """A gain and a bias per channel; `parameter_roles` names the gain only."""

    parameter_roles = {"weight": VECTOR}

    def __init__(self, *, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.shift = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight + self.shift


@register("norm", "test_wide_only_norm")
class WideOnlyNorm(nn.Module):
    """A gain per channel, for widths of 32 and more only."""

    parameter_roles = {"weight": VECTOR}

    def __init__(self, *, dim: int):
        super().__init__()
        if dim < 32:
            raise ValueError(f"WideOnlyNorm needs dim >= 32, got {dim}")
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight
