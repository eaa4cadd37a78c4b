"""Differential attention with both maps kept whole and combined before the product with V (the
`combined` backend): one autograd Function whose backward reuses the forward's maps.

- forward: per map, scores as a batched GEMM at width d with the causal mask as its -inf bias, a softmax;
  then A1 - λ A2 and one (A1 - λ A2) V product at width 2d: Eq. 1's FLOPs, a Transformer's with 2h heads
  of width d (the fused SDPA kernels need equal widths and do twice the core, Appendix A's
  FlashDiffAttn_1/2).
- backward: dV = (A1 - λ A2)^T dO, dA = dO V^T, dλ = -<dA, A2>, dS_m = softmax'(A_m; dA) scaled by
  1 or -λ, dQ = dS K, dK = dS^T Q: six GEMMs and a few passes over the maps, none recomputed.
- queries run in causal blocks of `BLOCK` rows (block i meets only keys [0, its end)), and the batch in
  chunks whose maps fit in `CHUNK_BYTES`, so every pass over a chunk's maps reads what its GEMM just wrote
  while it is still in the CPU's cache.

Why our own: at the `cpu` and `tiny` widths (sequence 256, sub-heads 16-32 wide) the N x N maps are small,
and what costs is SDPA's padded (2x) core and per-op overhead; no library kernel computes Eq. 1 with one
product (benchmarks/NOTES.md, "The `combined` core"). The maps are O(N^2) in memory, as
the `math` backend's, so `auto` picks this only for short sequences.

Layouts, as `components.attention.blockwise`: q (B, 2, G, R, N, d), k (B, 2, G, N, d), v (B, G, N, e)
-> out (B, G, R, N, e); grouped-query heads are stacked as rows of one GEMM, K and V never repeated.
"""

from __future__ import annotations

import math

import torch

CHUNK_BYTES = 1 << 23  # a chunk's maps, at most (one batch row at least); benchmarks/NOTES.md
BLOCK = 128  # query rows per causal block: block i meets only keys [0, its end); benchmarks/NOTES.md


@torch.compiler.disable
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor,
    *,
    chunk: int | None = None,
    block: int | None = None,
) -> torch.Tensor:
    """(softmax(Q1 K1^T / sqrt(d)) - λ softmax(Q2 K2^T / sqrt(d))) V, causal; shapes: module docstring.
    `chunk`: batch rows per chunk (default: as many as keep a chunk's maps within `CHUNK_BYTES`);
    `block`: query rows per causal block (default `BLOCK`)."""
    if q.shape[1] != 2 or k.shape[1] != 2:
        raise ValueError(f"combined attention: q {tuple(q.shape)} and k {tuple(k.shape)} need two maps")
    with torch.autocast(q.device.type, enabled=False):  # dtypes are chosen here, not by autocast
        if chunk is None:
            batch, _, groups, reps, n, _ = q.shape
            chunk = max(1, CHUNK_BYTES // (2 * groups * reps * n * n * q.element_size()))
        return _Combined.apply(q, k.to(q.dtype), v.to(q.dtype), lam, chunk, block or BLOCK)


class _Combined(torch.autograd.Function):
    # Inside, maps lead and a group's R query heads are interleaved per position: qs (2, B, G, N*R, d)
    # scaled by 1/sqrt(d), kc (2, B, G, N, d), so the rows of a query block are one contiguous range and
    # every (map, chunk, block) slice is a batch of row-major matrices that the batched GEMMs read in place.
    # The causal mask enters as the -inf bias of the score GEMM (baddbmm), which costs nothing over the plain
    # GEMM; a masked_fill_ pass cost as much as the GEMM. The maps of each block are kept for backward.

    @staticmethod
    def forward(ctx, q, k, v, lam, chunk, block):
        batch, _, groups, reps, n, d = q.shape
        qs = torch.empty(2, batch, groups, n, reps, d, dtype=q.dtype, device=q.device)
        torch.mul(q.permute(1, 0, 2, 4, 3, 5), 1.0 / math.sqrt(d), out=qs)
        qs = qs.view(2, batch, groups, n * reps, d)
        kc, vc = k.transpose(0, 1).contiguous(), v.contiguous()
        bias = torch.zeros(n, n, dtype=q.dtype, device=q.device).masked_fill_(
            torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf")
        )
        bias = bias.repeat_interleave(reps, dim=0)  # row (i, r): query i of head r of the group
        blocks = [(i0, min(n, i0 + block)) for i0 in range(0, n, block)]
        probs = [
            torch.empty(2, batch, groups, (i1 - i0) * reps, i1, dtype=q.dtype, device=q.device)
            for i0, i1 in blocks
        ]
        mixed = [torch.empty(p.shape[1:], dtype=q.dtype, device=q.device) for p in probs]
        out = torch.empty(batch, groups, n * reps, v.shape[-1], dtype=v.dtype, device=v.device)
        neg_lam = (-lam).to(q.dtype)
        for b in _chunks(batch, chunk):
            size = b.stop - b.start
            for (i0, i1), p, mix in zip(blocks, probs, mixed):
                rows = slice(i0 * reps, i1 * reps)
                for m in range(2):
                    scores = torch.baddbmm(
                        bias[rows, :i1].expand(size * groups, -1, -1),
                        qs[m, b, :, rows].flatten(0, 1),
                        kc[m, b, :, :i1].flatten(0, 1).transpose(-1, -2),
                    )
                    torch.softmax(scores.view(p[m, b].shape), dim=-1, out=p[m, b])
                torch.addcmul(p[0, b], p[1, b], neg_lam, out=mix[b])
                out[b, :, rows] = torch.matmul(mix[b], vc[b, :, :i1])
        ctx.save_for_backward(qs, kc, vc, lam, *probs, *mixed)
        ctx.chunk, ctx.blocks, ctx.reps = chunk, blocks, reps
        return out.view(batch, groups, n, reps, -1).transpose(2, 3)

    @staticmethod
    def backward(ctx, dout):
        qs, kc, vc, lam, *saved = ctx.saved_tensors
        blocks, reps = ctx.blocks, ctx.reps
        probs, mixed = saved[: len(blocks)], saved[len(blocks) :]
        _, batch, groups, _, d = qs.shape
        acc = torch.promote_types(qs.dtype, torch.float32)  # dK, dV and dλ sum over blocks and map entries
        dout = dout.to(vc.dtype).transpose(2, 3).reshape(batch, groups, -1, vc.shape[-1])
        lam_acc = lam.to(acc)
        q_factors = (1.0 / math.sqrt(d), -lam_acc / math.sqrt(d))  # dK sees the scale through Q
        k_factors = (1.0, -lam_acc)
        dq = torch.empty_like(qs)
        dk = torch.zeros(kc.shape, dtype=acc, device=kc.device)
        dv = torch.zeros(vc.shape, dtype=acc, device=vc.device)
        dlam = torch.zeros((), dtype=acc, device=lam.device)
        for b in _chunks(batch, ctx.chunk):
            for (i0, i1), p, mix in zip(blocks, probs, mixed):
                rows = slice(i0 * reps, i1 * reps)
                do = dout[b, :, rows]
                dv[b, :, :i1] += torch.matmul(mix[b].transpose(-1, -2), do)
                da = torch.matmul(do, vc[b, :, :i1].transpose(-1, -2))  # dL/d(A1 - λ A2)
                if da.dtype == acc:  # one pass, no product kept
                    dlam -= torch.dot(da.flatten(), p[1, b].flatten())
                else:
                    dlam -= torch.sum(da * p[1, b], dtype=acc)
                for m in range(2):
                    ds = torch.ops.aten._softmax_backward_data(da, p[m, b], -1, qs.dtype)
                    dq[m, b, :, rows] = torch.matmul(ds, kc[m, b, :, :i1]).mul_(q_factors[m])
                    dkm = torch.matmul(ds.transpose(-1, -2), qs[m, b, :, rows])
                    dk[m, b, :, :i1] += dkm if m == 0 else dkm.mul_(k_factors[1])
        dq = dq.view(2, batch, groups, -1, reps, d).permute(1, 0, 2, 4, 3, 5)
        return dq, dk.transpose(0, 1).to(kc.dtype), dv.to(vc.dtype), dlam.to(lam.dtype), None, None


def _chunks(batch: int, chunk: int):
    return (slice(b0, min(batch, b0 + chunk)) for b0 in range(0, batch, chunk))
