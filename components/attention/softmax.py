"""Softmax attention (kind `attention`, name `softmax`): the Transformer baseline of Table 6."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ablate.core.contract import HIDDEN, AttentionMaps, LogitTransform
from ablate.core.errors import UserError
from ablate.core.registry import build, register
from components.attention import backends
from components.norm import RMSNorm

KEY = "model.attention"


def kv_heads(n_kv_heads: int | None, heads: int, *, what: str = "heads") -> int:
    """The number of kv heads for grouped-query attention (None: as many as query heads), validated."""
    if n_kv_heads is None:
        return heads
    if isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, int) or n_kv_heads < 1:
        raise UserError(f"{KEY}.n_kv_heads: expected a positive integer or null, got {n_kv_heads!r}")
    if heads % n_kv_heads:
        raise UserError(f"{KEY}.n_kv_heads: {n_kv_heads} does not divide {heads} {what}")
    return n_kv_heads


@register("attention", "softmax")
class SoftmaxAttention(nn.Module):
    """Multi-head causal softmax attention (optional GQA, per-head RMSNorm), bias-free.

    Args:
        head_dim_mult: head width as a multiple of model.head_dim (Table 6's 8 heads of d = 256: 2)
        n_kv_heads: key/value heads for grouped-query attention (default: one per head)
        per_head_norm: RMSNorm over each head's channels (Table 6's "+ GroupNorm" row)
        norm_eps: epsilon of the per-head RMSNorm
    """

    residual_out = ("out_proj.weight",)
    # μP roles (ablate.core.contract); the per-head norm's gain is the RMSNorm's own (a vector).
    parameter_roles = dict.fromkeys(
        ("q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight"), HIDDEN
    )

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
        head_dim_mult: int = 1,
        n_kv_heads: int | None = None,
        per_head_norm: bool = False,
        norm_eps: float = 1e-5,
    ):
        super().__init__()
        if head_dim < 1 or head_dim_mult < 1:
            raise UserError(
                f"{KEY}.head_dim_mult: head width must be positive, got {head_dim} x {head_dim_mult}"
            )
        width = head_dim * head_dim_mult  # Table 6 row 2 ("8 heads, d = 256") doubles it
        if d_model % width:
            raise UserError(
                f"model.d_model: {d_model} is not divisible by the head width {width} "
                f"(head_dim {head_dim} x {KEY}.head_dim_mult {head_dim_mult})"
            )
        self.d_model, self.head_width = d_model, width
        self.n_heads = d_model // width
        self.n_kv_heads = kv_heads(n_kv_heads, self.n_heads)
        self.backend = backends.check_backend(backend, key=f"{KEY}.backend")
        self.backend_of = backends.Resolved(self.backend, head_dim=width)  # `auto`: once per device
        self.q_proj = nn.Linear(d_model, self.n_heads * width, bias=False)
        self.k_proj = nn.Linear(d_model, self.n_kv_heads * width, bias=False)
        self.v_proj = nn.Linear(d_model, self.n_kv_heads * width, bias=False)
        self.out_proj = nn.Linear(self.n_heads * width, d_model, bias=False)
        # Table 6 "+ GroupNorm": RMSNorm over each head's channels, one weight shared by the heads.
        self.subln = RMSNorm(dim=width, eps=norm_eps) if per_head_norm else None
        self.position = build("position", position, key="model.position", head_dim=width)
        # μP's 1/d logits (ablate.core.contract, head_ratio): queries times head_ratio^-1/2; 1.0 multiplies nothing.
        self.q_scale = float(head_ratio) ** -0.5

    def forward(
        self, x: torch.Tensor, *, return_weights: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x (B,N,d_model) -> (B,N,d_model); with `return_weights` also the maps (B,H,N,N), computed by
        the math backend whatever `backend` is (the fused kernels never form them)."""
        batch, n, _ = x.shape
        q, k, v = self.project(x)
        result = backends.attend(
            q, k, v, backend=self.backend_of(q.device, q.dtype), return_weights=return_weights
        )
        out, weights = result if return_weights else (result, None)
        if self.subln is not None:
            out = self.subln(out)
        out = self.out_proj(out.transpose(1, 2).reshape(batch, n, self.n_heads * self.head_width))
        return (out, weights) if return_weights else out

    def attend_with_maps(
        self, x: torch.Tensor, *, logit_transform: LogitTransform | None = None
    ) -> tuple[torch.Tensor, AttentionMaps]:
        """`forward(x)` by the math path, with its maps (ablate.core.contract): logits Q K^T / sqrt(d) (B,H,N,N),
        float32, after `logit_transform`; effective = A, the softmax of the (transformed) logits."""
        batch, n, _ = x.shape
        q, k, v = self.project(x)
        logits = backends.scaled_logits(q, k)  # (B,G,R,N,N)
        if logit_transform is not None:
            logits = logit_transform(logits.flatten(1, 2)).unflatten(1, logits.shape[1:3])
        weights = backends.causal_softmax(logits).to(q.dtype)
        out = (weights @ v.unsqueeze(2)).flatten(1, 2)  # the math backend's product, op for op
        if self.subln is not None:
            out = self.subln(out)
        out = self.out_proj(out.transpose(1, 2).reshape(batch, n, self.n_heads * self.head_width))
        return out, AttentionMaps(logits=(logits.flatten(1, 2),), effective=weights.flatten(1, 2))

    def resolved_backend(self, device: torch.device, dtype: torch.dtype, seq_len: int | None = None) -> str:
        """The attention core that runs for inputs on `device` of `dtype` (`seq_len`: unused, as for `diff`)."""
        return self.backend_of(device, dtype)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B,H,N,w) and k (B,H_kv,N,w), rotated, and v (B,H_kv,N,w) (views of the projections)."""
        batch, n, _ = x.shape
        heads, kv, width = self.n_heads, self.n_kv_heads, self.head_width
        q = self.position(self.q_proj(x).view(batch, n, heads, width).transpose(1, 2))
        k = self.position(self.k_proj(x).view(batch, n, kv, width).transpose(1, 2))
        if self.q_scale != 1.0:
            q = q * self.q_scale
        return q, k, self.v_proj(x).view(batch, n, kv, width).transpose(1, 2)

    def flops(self, seq_len: int) -> int:
        """Projections plus the dense causal maps (Q K^T and A V counted over all N x N entries)."""
        q_out, kv_out = self.n_heads * self.head_width, self.n_kv_heads * self.head_width
        projections = 2 * seq_len * self.d_model * (2 * q_out + 2 * kv_out)
        maps = 2 * (2 * self.n_heads * seq_len * seq_len * self.head_width)
        return projections + maps

    def describe(self) -> dict[str, object]:
        """Table 6's columns: #heads, d, GN (the component contract, ablate.core.contract)."""
        return {"heads": self.n_heads, "width": self.head_width, "per_head_norm": self.subln is not None}
