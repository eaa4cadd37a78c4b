"""A third-party attention variant, as a user would write it: one class, one decorator.

Recipes in the tests import it with `imports: [plugin_example]` (the tests put this folder on sys.path)
or name it with `class_path: plugin_example.LocalAttention`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ablate.core.registry import build, register

NAME = "test_local_attention"


@register("attention", NAME)
class LocalAttention(nn.Module):
    """Sliding-window causal softmax attention (test plugin): each token sees its last `window` tokens."""

    residual_out = ("out_proj.weight",)

    def __init__(self, *, d_model: int, head_dim: int, position: Any = "rope", window: int = 8):
        super().__init__()
        self.d_model, self.head_dim, self.window = d_model, head_dim, window
        self.n_heads = d_model // head_dim
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)
        self.position = build("position", position, key="model.position", head_dim=head_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, n, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, n, self.n_heads, self.head_dim).transpose(1, 2)

        q, k, v = (
            self.position(heads(self.q_proj(x))),
            self.position(heads(self.k_proj(x))),
            heads(self.v_proj(x)),
        )
        i = torch.arange(n, device=x.device)
        offset = i[:, None] - i[None, :]
        hidden = (offset < 0) | (offset >= self.window)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        weights = scores.masked_fill(hidden, float("-inf")).softmax(-1)
        return self.out_proj((weights @ v).transpose(1, 2).reshape(batch, n, self.d_model))

    def describe(self) -> dict[str, object]:
        return {"heads": self.n_heads, "width": self.head_dim, "per_head_norm": False}

    def flops(self, seq_len: int) -> int:
        projections = 4 * 2 * seq_len * self.d_model * self.d_model
        maps = 2 * 2 * self.n_heads * seq_len * seq_len * self.head_dim  # dense, like FlopCounterMode
        return projections + maps
