"""Differential attention (kind `attention`, name `diff`): Ye et al., ICLR 2025, Eq. 1-3.

Parameter layout is the reference's (docs/paper.md, Section 2.1), so its checkpoints load as they are:
`q_proj` (d_model -> 2h d) and `k_proj` (d_model -> 2 h_kv d) hold interleaved sub-heads of width d
(sub-head 2i is Q1 of head i, 2i+1 is Q2), `v_proj` (d_model -> h_kv 2d) holds heads of width 2d,
`lambda_q1, lambda_k1, lambda_q2, lambda_k2` (d,), `subln.weight` (2d,), `out_proj` (d_model -> d_model).

Under `model.parametrization: mup` (ablate.model.parametrization; the decisions in docs/parametrization.md):
the four projections are hidden matrices; both sub-maps take μP's 1/d logit scale (each is an ordinary
softmax over width-d sub-heads); λ's vectors are vector-like (Adam lr as at the base, no decay, the same
Normal(0, lambda_std) init) and each inner product λq·λk, a sum over d coordinates of two learned vectors,
is multiplied by d_base / d (the readout's 1/fan_in multiplier), so λ moves as much per step at every
head width; the per-head norm's gain is a vector; (1 - λ_init) is a fixed number, the same at every width.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ablate.core.contract import HIDDEN, VECTOR, AttentionMaps, LogitTransform
from ablate.core.errors import UserError
from ablate.core.registry import build, register
from components.attention import backends
from components.attention.softmax import KEY, kv_heads
from components.attention.triton import op as triton_op
from components.norm import RMSNorm, rms_norm

LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


@register("attention", "diff")
class DiffAttention(nn.Module):
    """Differential attention: (softmax(Q1K1) - λ softmax(Q2K2)) V, per-head RMSNorm, times 1 - λ_init.

    Args:
        n_kv_heads: key/value heads for grouped-query attention (default: one per head)
        per_head_norm: RMSNorm over each head's 2d channels (Eq. 3); false is Table 6's "- GroupNorm"
        lambda_init: the λ_init rule, a `lambda_init` component: exp_depth (Eq. 2) or {name: constant, value: 0.8}
        lambda_std: standard deviation of the λ vectors' normal initialisation (the reference's 0.1)
        norm_eps: epsilon of the per-head RMSNorm
    """

    residual_out = ("out_proj.weight",)
    # μP roles (ablate.core.contract; the decisions: docs/parametrization.md). The projections map width to
    # width; λ's vectors have one width dimension (d); the per-head norm's gain is the RMSNorm's (a vector).
    parameter_roles = {
        **dict.fromkeys(("q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight"), HIDDEN),
        **dict.fromkeys(LAMBDAS, VECTOR),
    }
    # The attention core's FLOPs under each way of running Eq. 1, relative to `flops` (Eq. 1 as written,
    # one product (A1 - λ A2) V); read by `ablate bench` for its ceilings. FlashDiffAttn_1/2: Appendix A.
    # The blockwise backend trains with a padded (2x) forward and a one-product (1x) backward: under the
    # budget's convention (backward = 2 x forward) that is (2 + 2 x 1) / 3 of the core.
    kernel_forms = {
        "one product (math, blocks)": 1.0,
        "blockwise (fwd 2x, bwd 1x)": 4 / 3,
        "V 2d wide (FlashDiffAttn_1)": 1.5,
        "split V or padded (FlashDiffAttn_2)": 2.0,
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
        per_head_norm: bool = True,
        lambda_init: Any = "exp_depth",
        lambda_std: float = 0.1,
        norm_eps: float = 1e-5,
    ):
        super().__init__()
        if head_dim < 1 or d_model % (2 * head_dim):
            raise UserError(f"model.d_model: {d_model} is not divisible by 2 x head_dim = {2 * head_dim}")
        if lambda_std < 0:
            raise UserError(f"{KEY}.lambda_std: must be >= 0, got {lambda_std}")
        d = head_dim
        self.d_model, self.head_dim = d_model, d
        self.n_heads = d_model // (2 * d)  # h = d_model / 2d: a Transformer's 2h heads of width d
        self.n_kv_heads = kv_heads(n_kv_heads, self.n_heads, what="diff heads")
        self.backend = backends.check_backend(backend, key=f"{KEY}.backend")
        self.backend_of = backends.Resolved(self.backend, diff=True, head_dim=d)  # `auto`: once per device
        self.q_proj = nn.Linear(d_model, 2 * self.n_heads * d, bias=False)
        self.k_proj = nn.Linear(d_model, 2 * self.n_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(d_model, self.n_kv_heads * 2 * d, bias=False)
        self.out_proj = nn.Linear(self.n_heads * 2 * d, d_model, bias=False)
        strategy = build("lambda_init", lambda_init, key=f"{KEY}.lambda_init")
        self.lambda_init = float(strategy(layer_idx))
        self.lambda_rule = _rule(strategy, lambda_init)
        self.lambda_std = float(lambda_std)
        for name in LAMBDAS:  # Eq. 2; float32 whatever the model's dtype (the reference's choice)
            setattr(
                self, name, nn.Parameter(torch.empty(d, dtype=torch.float32).normal_(0.0, self.lambda_std))
            )
        # Eq. 3: RMSNorm over each head's 2d channels (one weight shared by the heads), then x (1 - λ_init).
        # Table 6 "- GroupNorm" removes only the norm, so the fixed (1 - λ_init) factor stays without it.
        self.subln = RMSNorm(dim=2 * d, eps=norm_eps) if per_head_norm else None
        self.position = build("position", position, key="model.position", head_dim=d)
        # μP (ablate.core.contract, head_ratio): both maps' logits Q K^T / d (queries times head_ratio^-1/2),
        # and λ's inner products λq·λk over d times 1 / head_ratio. 1.0 multiplies nothing.
        self.q_scale = float(head_ratio) ** -0.5
        self.lambda_dot_scale = 1.0 / float(head_ratio)

    @property
    def init_std(self) -> dict[str, float]:
        """The model initialises the λ vectors Normal(0, lambda_std) (reference: 0.1)."""
        return dict.fromkeys(LAMBDAS, self.lambda_std)

    def resolved_backend(self, device: torch.device, dtype: torch.dtype, seq_len: int | None = None) -> str:
        """The attention core that runs for inputs on `device` of `dtype` (and `seq_len` long, where known)."""
        return self.backend_of(device, dtype, seq_len)

    def lambda_value(self) -> torch.Tensor:
        """λ = exp(λq1·λk1) - exp(λq2·λk2) + λ_init (Eq. 2), a float32 0-dim tensor (with its graph)."""
        dot1 = torch.sum(self.lambda_q1.float() * self.lambda_k1.float())
        dot2 = torch.sum(self.lambda_q2.float() * self.lambda_k2.float())
        if self.lambda_dot_scale != 1.0:  # μP: an inner product over the width d (module docstring of diff)
            dot1, dot2 = dot1 * self.lambda_dot_scale, dot2 * self.lambda_dot_scale
        return torch.exp(dot1) - torch.exp(dot2) + self.lambda_init

    def forward(
        self, x: torch.Tensor, *, return_weights: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """x (B,N,d_model) -> (B,N,d_model); with `return_weights` also {"a1", "a2": (B,h,N,N), "lambda"},
        computed by the math backend whatever `backend` is (the fused kernels never form the maps)."""
        batch, n, _ = x.shape
        q, k, v = self.project(x)
        backend = self.backend_of(q.device, q.dtype, q.shape[-2])
        if backend == "triton" and self.subln is not None and not return_weights:
            # Eq. 3's norm times (1 - λ_init) in the kernel's epilogue, its backward in the δ pass
            norm = (self.subln.weight, self.subln.eps, 1 - self.lambda_init)
            out, weights = triton_op.diff_attention(q, k, v, self.lambda_value(), norm=norm), None
        else:
            result = backends.diff_attend_maps(
                q, k, v, self.lambda_value(), backend=backend, return_weights=return_weights
            )
            out, weights = result if return_weights else (result, None)  # (B,h,N,2d)
            if self.subln is not None:  # Eq. 3, times the fixed (1 - λ_init)
                out = rms_norm(out, self.subln.weight, self.subln.eps, 1 - self.lambda_init)
            else:
                out = out * (1 - self.lambda_init)
        out = self.out_proj(out.transpose(1, 2).reshape(batch, n, self.n_heads * 2 * self.head_dim))
        return (out, weights) if return_weights else out

    def attend_with_maps(
        self, x: torch.Tensor, *, logit_transform: LogitTransform | None = None
    ) -> tuple[torch.Tensor, AttentionMaps]:
        """`forward(x)` by the math path, with its maps (ablate.core.contract): logits = (Q1 K1^T, Q2 K2^T) / sqrt(d),
        each (B,h,N,N) float32 after `logit_transform` (Q1 and Q2 of head i meet K1 and K2 of its kv group);
        effective = A1 - λ A2 (Eq. 1), the maps the head's values are mixed by."""
        batch, n, _ = x.shape
        q, k, v = self.project(x)
        logits = [backends.scaled_logits(q[:, c], k[:, c]) for c in range(2)]  # (B,G,R,N,N) each
        if logit_transform is not None:
            logits = [logit_transform(t.flatten(1, 2)).unflatten(1, t.shape[1:3]) for t in logits]
        a1, a2 = (backends.causal_softmax(t) for t in logits)
        # The math backend's Eq. 1, op for op: one product with V.
        effective = (a1 - self.lambda_value().float() * a2).to(v.dtype)
        out = (effective @ v.unsqueeze(2)).flatten(1, 2)  # (B,h,N,2d)
        if self.subln is not None:  # Eq. 3, times the fixed (1 - λ_init), as in forward
            out = rms_norm(out, self.subln.weight, self.subln.eps, 1 - self.lambda_init)
        else:
            out = out * (1 - self.lambda_init)
        out = self.out_proj(out.transpose(1, 2).reshape(batch, n, self.n_heads * 2 * self.head_dim))
        maps = AttentionMaps(logits=tuple(t.flatten(1, 2) for t in logits), effective=effective.flatten(1, 2))
        return out, maps

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B,2,h,N,d) = [Q1, Q2] and k (B,2,h_kv,N,d) = [K1, K2], rotated; v (B,h_kv,N,2d).

        RoPE turns every sub-head; the pairs are then views (sub-head 2i + c is map c of head i), so
        nothing is copied to pair them. Three GEMMs: one against the weights concatenated measured no
        faster (the concatenation and its cast cost what the wider GEMM saves; benchmarks/NOTES.md).
        """
        batch, n, _ = x.shape
        d, h, h_kv = self.head_dim, self.n_heads, self.n_kv_heads
        q = self.position(self.q_proj(x).view(batch, n, 2 * h, d).transpose(1, 2))
        k = self.position(self.k_proj(x).view(batch, n, 2 * h_kv, d).transpose(1, 2))
        if self.q_scale != 1.0:
            q = q * self.q_scale
        v = self.v_proj(x).view(batch, n, h_kv, 2 * d).transpose(1, 2)
        return q.unflatten(1, (h, 2)).transpose(1, 2), k.unflatten(1, (h_kv, 2)).transpose(1, 2), v

    def flops(self, seq_len: int) -> int:
        """Projections plus Eq. 1 as the math form computes it: Q K^T for 2h sub-heads of width d and one
        (A1 - λ A2) V product with V of width 2d, maps dense; equal to a Transformer with 2h heads of width d."""
        d, h, h_kv, n = self.head_dim, self.n_heads, self.n_kv_heads, seq_len
        projections = 2 * n * self.d_model * (2 * h * d + 2 * h_kv * d + 2 * h_kv * d + 2 * h * d)
        scores = 2 * (2 * h) * n * n * d
        mix = 2 * h * n * n * (2 * d)
        return projections + scores + mix

    def describe(self) -> dict[str, object]:
        """Table 6's columns: #heads (diff heads h), d, GN, and the λ_init rule (the component contract)."""
        return {
            "heads": self.n_heads,
            "width": self.head_dim,
            "per_head_norm": self.subln is not None,
            "lambda": self.lambda_rule,
        }


def _rule(strategy: object, spec: Any) -> str:
    """The λ_init rule in its own words (`describe()` of the strategy), else its name."""
    describe = getattr(strategy, "describe", None)
    if callable(describe):
        return str(describe())
    return str(spec.get("name") or spec.get("class_path")) if isinstance(spec, dict) else str(spec)
