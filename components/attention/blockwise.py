"""Causal attention whose backward runs in blocks of queries, in PyTorch operations (the `blockwise`
backend); the forward is a fused kernel's when one is given, else the same blocks.

- backward: the maps of each block of `block` queries against its causal key prefix are recomputed
  (FlashAttention pays the same), then dV += P^T dO, dP = dO V^T, dS = softmax'(dP), dQ = dS K,
  dK += dS^T Q, all as batched GEMMs. Nothing of size N x N is kept between forward and backward.
- forward: `fused_forward(q, k, v, lam)` (the backends pass SDPA's fused kernel, padded for
  differential attention) computes the output without autograd; without it, the same blocks do.
- differential attention (two maps per head): the maps are combined before the product with V, so
  (A1 - λ A2) V is one GEMM with V of width 2d, the FLOPs of Eq. 1 as written (a Transformer's with
  twice the heads); a fused kernel that needs equal widths does twice the attention core (Appendix A).
- grouped-query attention: the R query heads of a kv group are stacked as rows of one GEMM against that
  group's keys; K and V are never repeated.

Why: on this project's 2-core AMX CPU (torch 2.13, bf16) SDPA's fused CPU backward is slower than these
GEMMs on 256-row blocks for N <= 2048 (benchmarks/NOTES.md), while its forward is the fastest there is;
on a CPU with AVX512-BF16 but no AMX the blocks' forward (Eq. 1's FLOPs, half the padded kernel's) is
faster too for sub-heads of 32 and 64 (the `blocks` backend; NOTES.md, "A second CPU kind").

Numerics, stated because they differ from a fused kernel: in backward, scores and dP leave the bf16
GEMMs rounded to bf16 before the float32 softmax statistics (torch has no bf16 x bf16 -> fp32 GEMM on
CPU), and the softmax scale is folded into Q (exact for a power-of-two head width); dK, dV and dλ are
accumulated in float32. The gradient is the float32-score forward's to bf16 precision. In float32
everything is float32.

Layouts (any strides; map m of head (g, r) is query head m*h + g*R + r of the stacked form):
q (B, M, G, R, N, d), k (B, M, G, N, d), v (B, G, N, e) -> out (B, G, R, N, e).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

BLOCK = 256  # query rows per block; benchmarks/NOTES.md (128 / 256 / 384 / 512 measured at N = 1024, 4096)


@torch.compiler.disable  # traced, the block loop unrolls: ~10 min to compile a 12-layer model, no gain
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor | None = None,
    *,
    block: int | None = None,
    fused_forward: Callable | None = None,
) -> torch.Tensor:
    """Causal softmax attention (M = 1, `lam` None) or differential attention (M = 2):
    (softmax(Q1 K1^T / sqrt(d)) - λ softmax(Q2 K2^T / sqrt(d))) V. Shapes: module docstring.
    `block`: query rows per block (default `BLOCK`, read at call time); `fused_forward(q, k, v, lam)`
    -> (B, G, R, N, e): the forward's output from elsewhere (run without autograd)."""
    maps = q.shape[1]
    if maps != k.shape[1] or maps != (1 if lam is None else 2):
        raise ValueError(
            f"blockwise attention: {maps} query maps, {k.shape[1]} key maps, lam {lam is not None}"
        )
    if lam is None:
        lam = torch.zeros((), dtype=torch.float32, device=q.device)
    with torch.autocast(q.device.type, enabled=False):  # dtypes are chosen here, not by autocast
        return _Blockwise.apply(q, k.to(q.dtype), v.to(q.dtype), lam, block or BLOCK, fused_forward)


def _map_factors(lam: torch.Tensor, maps: int) -> torch.Tensor:
    """d(mixed map)/d(map m): 1 for A1, -λ for A2; shaped to broadcast over (M, B, G, rows, width)."""
    one = torch.ones((), dtype=lam.dtype, device=lam.device)
    return torch.stack([one, -lam])[:maps].view(maps, 1, 1, 1, 1)


class _Blockwise(torch.autograd.Function):
    # Inside, maps lead ((M, B, G, ...)) so that each map's block is contiguous, and the key prefix of a
    # block is copied to a contiguous tensor first: the oneDNN batched GEMM copies any operand whose
    # batch stride is not its matrix size, and its own copy of a transposed prefix is several times
    # slower than a straight copy followed by a transposed (free) view. benchmarks/NOTES.md.

    @staticmethod
    def forward(ctx, q, k, v, lam, block, fused_forward):
        ctx.save_for_backward(q, k, v, lam)
        ctx.block = block
        if fused_forward is not None:
            return fused_forward(q, k, v, lam)
        qs, kc, vc = _operands(q, k, v)
        maps, batch, groups, reps, n, _ = qs.shape
        out = torch.empty(batch, n, groups, reps, v.shape[-1], dtype=v.dtype, device=v.device)
        neg_lam = (-lam).to(v.dtype)
        mask = torch.ones(block, block, dtype=torch.bool, device=q.device).triu(1)
        for i0 in range(0, n, block):
            i1 = min(n, i0 + block)
            _, _, p = _probabilities(qs, kc, i0, i1, mask)  # (M, B, G, R*bq, i1)
            mixed = p[0] if maps == 1 else torch.addcmul(p[0], p[1], neg_lam)  # A1 - λ A2
            o = torch.matmul(mixed, _prefix(vc, i1))  # (B, G, R*bq, e)
            out[:, i0:i1] = o.unflatten(2, (reps, i1 - i0)).permute(0, 3, 1, 2, 4)
        return out.permute(0, 2, 3, 1, 4)  # (B, G, R, N, e), laid out (B, N, G, R, e)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, lam = ctx.saved_tensors
        block = ctx.block
        qs, kc, vc = _operands(q, k, v)
        maps, batch, groups, reps, n, d = qs.shape
        dout = dout.to(v.dtype)
        neg_lam = (-lam).to(v.dtype)
        acc = torch.promote_types(q.dtype, torch.float32)  # dK, dV, dλ sum over query blocks
        dq = torch.empty(qs.shape, dtype=q.dtype, device=q.device)
        dk = torch.zeros(kc.shape, dtype=acc, device=k.device)
        dv = torch.zeros(vc.shape, dtype=acc, device=v.device)
        dlam = torch.zeros((), dtype=acc, device=lam.device)
        factors = _map_factors(lam.to(acc), maps)  # dK sees the scale through Q; dQ needs it once more
        q_factors = factors / math.sqrt(d)
        mask = torch.ones(block, block, dtype=torch.bool, device=q.device).triu(1)
        for i0 in range(0, n, block):
            i1 = min(n, i0 + block)
            bq = i1 - i0
            qb, kp, p = _probabilities(qs, kc, i0, i1, mask)  # recomputed, (M, B, G, R*bq, i1)
            mixed = p[0] if maps == 1 else torch.addcmul(p[0], p[1], neg_lam)
            vp = _prefix(vc, i1)
            do = dout[:, :, :, i0:i1].reshape(batch, groups, reps * bq, -1)  # (B, G, R*bq, e)
            dv[:, :, :i1] += torch.matmul(mixed.transpose(-1, -2), do)
            dp = torch.matmul(do, vp.transpose(-1, -2))  # dL/d(mixed), (B, G, R*bq, i1)
            if maps == 2:
                dlam -= torch.sum(dp * p[1], dtype=acc)
            ds = torch.empty_like(p)
            for m in range(maps):  # the out= form writes straight into the contiguous map m
                torch.ops.aten._softmax_backward_data.out(dp, p[m], -1, p.dtype, grad_input=ds[m])
            dq[:, :, :, :, i0:i1] = (torch.matmul(ds, kp) * q_factors).unflatten(3, (reps, bq))
            dk[:, :, :, :i1].addcmul_(torch.matmul(ds.transpose(-1, -2), qb), factors)
        return (
            dq.transpose(0, 1),
            dk.transpose(0, 1).to(k.dtype),
            dv.to(v.dtype),
            dlam.to(lam.dtype),
            None,
            None,
        )


def _operands(q, k, v):
    """Contiguous (M, B, G, R, N, d) queries times the softmax scale, (M, B, G, N, d) keys, (B, G, N, e)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    qs = torch.empty(q.transpose(0, 1).shape, dtype=q.dtype, device=q.device)
    torch.mul(q.transpose(0, 1), scale, out=qs)
    return qs, k.transpose(0, 1).contiguous(), v.contiguous()


def _prefix(t: torch.Tensor, i1: int) -> torch.Tensor:
    """Rows [0, i1) of every matrix of `t` (..., N, w), as a contiguous tensor (see the class comment)."""
    return t if i1 == t.shape[-2] else t[..., :i1, :].contiguous()


def _probabilities(qs, kc, i0: int, i1: int, mask: torch.Tensor):
    """The query block [i0, i1) (M, B, G, R*bq, d), its key prefix (M, B, G, i1, d) and the causal softmax
    of its scores (M, B, G, R*bq, i1)."""
    maps, batch, groups, reps, _, d = qs.shape
    bq = i1 - i0
    qb = qs[:, :, :, :, i0:i1].reshape(maps, batch, groups, reps * bq, d).contiguous()
    kp = _prefix(kc, i1)
    scores = torch.matmul(qb, kp.transpose(-1, -2))
    diagonal = scores.view(maps, batch, groups, reps, bq, i1)[..., i0:i1]
    diagonal.masked_fill_(mask[:bq, :bq], float("-inf"))
    return qb, kp, torch.softmax(scores, dim=-1)
