"""Diff V2 attention (kind `attention`, name `diff_v2`): the authors' second version (docs/paper.md, "Diff V2").

Layout (the authors' names, no biases): `q_proj` d_model -> 2h·d (2h query heads of width d, the
Transformer's head width), `k_proj` and `v_proj` d_model -> h_kv·d, `o_proj` h·d -> d_model, and
`lambda_proj` d_model -> h. One causal attention call over the 2h query heads, query head j reading kv
head j // (2h / h_kv), so heads 2i and 2i+1 share a kv head (the pairing the authors call crucial); then,
per token and head, out_i = attn_2i - sigmoid(lambda_proj(x))_i · attn_2i+1. No per-head norm, no λ_init,
no (1 - λ_init) factor, no exp re-parameterisation. RoPE on every query and key head.

Heads: h = heads_mult · d_model / d. With heads_mult 1 (the default) h is the Transformer's head count,
so with V2 switched off (only the even query heads, no λ) the same module is the Transformer: V2 is the
baseline plus h·d more rows of `q_proj` and `lambda_proj`, and twice the QK^T and AV work. Matching it to
a baseline is the recipe's job (`match:`; recipes/diff-v2.yaml). heads_mult 0.5 gives Diff V1's h =
d_model / 2d, where the attention maps cost what the Transformer's cost.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ablate.core.contract import HIDDEN, OUTPUT, AttentionMaps, LogitTransform
from ablate.core.errors import UserError
from ablate.core.registry import build, register
from components.attention import backends
from components.attention.softmax import KEY, kv_heads


@register("attention", "diff_v2")
class DiffV2Attention(nn.Module):
    """Diff V2: 2h query heads, out_i = attn_2i - sigmoid(λ_proj x)_i attn_2i+1 (no norm, no λ_init).

    Args:
        n_kv_heads: key/value heads for grouped-query attention (default: one per head)
        heads_mult: the heads h as a multiple of d_model / head_dim (0.5: Diff V1's h)
    """

    residual_out = ("o_proj.weight",)
    # μP roles (ablate.core.contract): λ_proj reads the residual stream out into one gate per head.
    parameter_roles = {
        **dict.fromkeys(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"), HIDDEN),
        "lambda_proj.weight": OUTPUT,
    }

    def __init__(
        self,
        *,
        d_model: int,
        head_dim: int,
        layer_idx: int = 0,
        n_layers: int = 1,
        position: Any = "rope",
        backend: str = "auto",
        head_ratio: float = 1.0,
        n_kv_heads: int | None = None,
        heads_mult: float = 1.0,
    ):
        super().__init__()
        heads = d_model * heads_mult / head_dim if head_dim > 0 and heads_mult > 0 else 0.0
        if heads < 1 or abs(heads - round(heads)) > 1e-9:
            raise UserError(
                f"{KEY}.heads_mult: h = heads_mult x d_model / head_dim = {heads_mult} x {d_model} / {head_dim} "
                "must be a positive whole number"
            )
        d, h = head_dim, int(round(heads))
        self.d_model, self.head_dim, self.n_heads = d_model, d, h
        self.n_kv_heads = kv_heads(n_kv_heads, h)  # h_kv | h: heads 2i and 2i+1 then share kv head
        self.backend = backends.check_backend(backend, key=f"{KEY}.backend")
        self.backend_of = backends.Resolved(self.backend, head_dim=d)  # `auto`: once per device
        self.q_proj = nn.Linear(d_model, 2 * h * d, bias=False)
        self.k_proj = nn.Linear(d_model, self.n_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(d_model, self.n_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(h * d, d_model, bias=False)
        self.lambda_proj = nn.Linear(d_model, h, bias=False)
        self.position = build("position", position, key="model.position", head_dim=d)
        self.q_scale = float(head_ratio) ** -0.5  # μP's 1/d logits (ablate.core.contract)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B,2h,N,d) and k (B,h_kv,N,d), rotated, and v (B,h_kv,N,d)."""
        batch, n, _ = x.shape
        d, h, h_kv = self.head_dim, self.n_heads, self.n_kv_heads
        q = self.position(self.q_proj(x).view(batch, n, 2 * h, d).transpose(1, 2))
        k = self.position(self.k_proj(x).view(batch, n, h_kv, d).transpose(1, 2))
        if self.q_scale != 1.0:
            q = q * self.q_scale
        return q, k, self.v_proj(x).view(batch, n, h_kv, d).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B,N,d_model) -> (B,N,d_model)."""
        q, k, v = self.project(x)
        backend = self.backend_of(q.device, q.dtype)
        attn = backends.attend(q, k, v, backend=backend)  # (B,2h,N,d): one call, GQA pairing
        return self._combine(x, attn[:, 0::2], attn[:, 1::2])

    def _combine(self, x: torch.Tensor, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        """out_i = first_i - sigmoid(λ_proj x)_i second_i, per token; heads merged and projected."""
        batch, n, _ = x.shape
        sigma = torch.sigmoid(self.lambda_proj(x)).transpose(1, 2).unsqueeze(-1)  # (B,h,N,1)
        out = first - sigma * second
        return self.o_proj(out.transpose(1, 2).reshape(batch, n, self.n_heads * self.head_dim))

    def attend_with_maps(
        self, x: torch.Tensor, *, logit_transform: LogitTransform | None = None
    ) -> tuple[torch.Tensor, AttentionMaps]:
        """The math form with its maps: logits (B,2h,N,N) over the 2h query heads, and the effective map
        A_2i - σ_i A_2i+1 (σ per query row) that output head i applies to its kv head's values."""
        q, k, v = self.project(x)
        group = 2 * self.n_heads // self.n_kv_heads
        keys = k.repeat_interleave(group, dim=1)  # query head j reads kv head j // group
        logits = (q @ keys.transpose(-1, -2)).float() / math.sqrt(self.head_dim)
        if logit_transform is not None:
            logits = logit_transform(logits)
        n = x.shape[1]
        future = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
        maps = logits.masked_fill(future, float("-inf")).softmax(dim=-1)
        sigma = torch.sigmoid(self.lambda_proj(x).float()).transpose(1, 2).unsqueeze(-1)  # (B,h,N,1)
        effective = maps[:, 0::2] - sigma * maps[:, 1::2]  # (B,h,N,N)
        values = v.repeat_interleave(group // 2, dim=1)  # output head i reads kv head 2i // group
        out = (effective.to(v.dtype) @ values).transpose(1, 2).flatten(2)
        return self.o_proj(out), AttentionMaps(logits=(logits,), effective=effective)

    def resolved_backend(self, device: torch.device, dtype: torch.dtype, seq_len: int | None = None) -> str:
        """The attention core that runs for inputs on `device` of `dtype` (`seq_len`: unused, as for `diff`)."""
        return self.backend_of(device, dtype)

    def flops(self, seq_len: int) -> int:
        """Projections (q 2h·d, k and v h_kv·d, λ h, o h·d) plus the dense maps of 2h query heads
        (Q K^T and A V, each 2·2h·N²·d); the per-token combination is element-wise (not counted)."""
        d, h, h_kv, n = self.head_dim, self.n_heads, self.n_kv_heads, seq_len
        projections = 2 * n * self.d_model * (2 * h * d + 2 * h_kv * d + h + h * d)
        maps = 2 * (2 * 2 * h * n * n * d)
        return projections + maps

    def describe(self) -> dict[str, object]:
        """#heads: h output heads (2h query heads); d; no per-head norm; λ per token and head."""
        return {
            "heads": f"{self.n_heads} ({2 * self.n_heads} q)",
            "width": self.head_dim,
            "per_head_norm": False,
            "lambda": "sigmoid(λ_proj x)",
        }
