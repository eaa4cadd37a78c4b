"""Differential attention as one FlashAttention-style Triton kernel per direction (`triton` backend).

Why our own: a fused kernel for ordinary attention computes Eq. 1 only by being called twice (split V or
FlashDiffAttn's decomposition, Appendix A): two passes over K and V and two outputs written and combined.
Here each query block walks its K/V tiles once, keeps the online-softmax statistics of both maps, meets
the shared V tile with both maps, and writes (A1 - λ A2) V once. With one map (`MAPS = 1`) it is plain
causal softmax attention, so the Transformer arm can be timed on the same code.

- forward (`_fwd`): per (query block, batch, head): O = O1 - λ O2 with O_m = A_m V, O2 (for the
  backward), and each map's log-sum-exp of the scaled scores (natural log, float32).
- backward: with δ1 = rowsum(dO · O1) = rowsum(dO · O) + λ δ2 and δ2 = rowsum(dO · O2) (`_bwd_delta`;
  the caller sums dλ = -Σ δ2), both maps are recomputed per tile from the log-sum-exp: P_m = exp(S_m - lse_m),
  dP = dO V^T (shared), dS1 = P1 (dP - δ1), dS2 = -λ P2 (dP - δ2), dV = (P1 - λ P2)^T dO.
  `_bwd_kv` (per key block and kv head, looping over the group's query heads: no atomics) writes dK1,
  dK2, dV; `_bwd_q` (per query block and head) writes dQ1, dQ2.

Layouts (any strides): q (B, M, h, N, d) = the maps' queries stacked on dim 1, k (B, M, h_kv, N, d),
v (B, h_kv, N, e); query head i reads kv head i // (h / h_kv). Widths are padded to powers of two (16 at
least, `tl.dot`'s minimum) and masked, as are sequence tails. Products accumulate in float32; float32
inputs multiply in IEEE float32 (no TF32). `DOT` is the type the products' operands are cast to: the
inputs' own (a no-op) on the GPU; float32 for bf16 under the interpreter, whose `tl.dot` multiplies bf16
as raw 16-bit integers (a bf16 product is exact in float32, and the maps are rounded to bf16 first, so the
arithmetic is the GPU's).

The functions are plain Python: `kernels(interpret)` wraps them with `triton.jit` for CUDA tensors or
Triton's interpreter for CPU tensors. `TRITON_INTERPRET=1` would decide that once, when triton is first
imported (Lightning imports it early), so the kernels call only Triton's built-ins, which the interpreter
patches per launch: one process runs both kinds, whatever imported triton first.
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)  # module constants a kernel reads are constexpr
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)
# Reductions name their combining functions instead of calling tl.max / tl.sum: those are themselves
# jit functions, decorated when triton was imported, and a kernel run by the interpreter cannot call the
# compiled kind (the interpreter recognises these two and reduces with numpy).
_MAX = tl.standard._elementwise_max
_SUM = tl.standard._sum_combine


def _fwd(
    Q, K, V, OUT, O2, LSE, LAM,
    sqb, sqm, sqh, sqn, sqd,
    skb, skm, skh, skn, skd,
    svb, svh, svn, sve,
    sob, soh, son, soe,
    heads, reps, n_ctx, width, v_width, scale,
    MAPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, PRECISION: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // heads
    head = pid_bh % heads
    group = head // reps
    qk_scale = scale * LOG2E  # scores in base 2: exp2 is the cheap one
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    row_ok = offs_m < n_ctx
    q_ptrs = Q + b * sqb + head * sqh + offs_m[:, None] * sqn + offs_d[None, :] * sqd
    q_mask = row_ok[:, None] & (offs_d[None, :] < width)
    q1 = tl.load(q_ptrs, mask=q_mask, other=0.0).to(DOT)
    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l1 = tl.full([BLOCK_M], 0.0, tl.float32)
    acc1 = tl.full([BLOCK_M, BLOCK_E], 0.0, tl.float32)
    if MAPS == 2:
        q2 = tl.load(q_ptrs + sqm, mask=q_mask, other=0.0).to(DOT)
        m2 = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l2 = tl.full([BLOCK_M], 0.0, tl.float32)
        acc2 = tl.full([BLOCK_M, BLOCK_E], 0.0, tl.float32)
    k_base = K + b * skb + group * skh
    v_base = V + b * svb + group * svh
    hi = tl.minimum((pid_m + 1) * BLOCK_M, n_ctx)  # causal: keys up to the block's last row
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok = offs_n < n_ctx
        kt_ptrs = k_base + offs_n[None, :] * skn + offs_d[:, None] * skd  # K^T tile (BLOCK_D, BLOCK_N)
        kt_mask = col_ok[None, :] & (offs_d[:, None] < width)
        v_tile = tl.load(
            v_base + offs_n[:, None] * svn + offs_e[None, :] * sve,
            mask=col_ok[:, None] & (offs_e[None, :] < v_width),
            other=0.0,
        ).to(DOT)
        visible = (offs_m[:, None] >= offs_n[None, :]) & col_ok[None, :]
        k1t = tl.load(kt_ptrs, mask=kt_mask, other=0.0).to(DOT)
        s1 = tl.dot(q1, k1t, input_precision=PRECISION) * qk_scale
        s1 = tl.where(visible, s1, float("-inf"))
        m1_new = tl.maximum(m1, tl.reduce(s1, 1, _MAX))
        p1 = tl.exp2(s1 - m1_new[:, None])
        alpha1 = tl.exp2(m1 - m1_new)
        l1 = l1 * alpha1 + tl.reduce(p1, 1, _SUM)
        acc1 = acc1 * alpha1[:, None] + tl.dot(
            p1.to(Q.dtype.element_ty).to(DOT), v_tile, input_precision=PRECISION
        )
        m1 = m1_new
        if MAPS == 2:
            k2t = tl.load(kt_ptrs + skm, mask=kt_mask, other=0.0).to(DOT)
            s2 = tl.dot(q2, k2t, input_precision=PRECISION) * qk_scale
            s2 = tl.where(visible, s2, float("-inf"))
            m2_new = tl.maximum(m2, tl.reduce(s2, 1, _MAX))
            p2 = tl.exp2(s2 - m2_new[:, None])
            alpha2 = tl.exp2(m2 - m2_new)
            l2 = l2 * alpha2 + tl.reduce(p2, 1, _SUM)
            acc2 = acc2 * alpha2[:, None] + tl.dot(
                p2.to(Q.dtype.element_ty).to(DOT), v_tile, input_precision=PRECISION
            )
            m2 = m2_new
    out = acc1 / l1[:, None]
    o_off = b * sob + head * soh + offs_m[:, None] * son + offs_e[None, :] * soe
    o_mask = row_ok[:, None] & (offs_e[None, :] < v_width)
    lse_ptrs = LSE + (b * MAPS * heads + head) * n_ctx + offs_m  # LSE (B, MAPS, h, N) contiguous
    tl.store(lse_ptrs, (m1 + tl.log2(l1)) * LN2, mask=row_ok)
    if MAPS == 2:
        lam = tl.load(LAM)
        out2 = acc2 / l2[:, None]
        out = out - lam * out2
        tl.store(O2 + o_off, out2.to(O2.dtype.element_ty), mask=o_mask)
        tl.store(lse_ptrs + heads * n_ctx, (m2 + tl.log2(l2)) * LN2, mask=row_ok)
    tl.store(OUT + o_off, out.to(OUT.dtype.element_ty), mask=o_mask)


def _bwd_delta(
    OUT, O2, DO, DELTA, LAM,
    sob, soh, son, soe,
    sdb, sdh, sdn, sde,
    heads, n_ctx, v_width,
    MAPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr,
):  # fmt: skip
    # δ2 = rowsum(dO · O2) and δ1 = rowsum(dO · O) + λ δ2 (δ = rowsum(dO · O) for one map), float32, into
    # DELTA (B, MAPS, h, N) contiguous: one read of dO, O and O2.
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // heads
    head = pid_bh % heads
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_e = tl.arange(0, BLOCK_E)
    row_ok = offs_m < n_ctx
    mask = row_ok[:, None] & (offs_e[None, :] < v_width)
    o_off = b * sob + head * soh + offs_m[:, None] * son + offs_e[None, :] * soe
    do = tl.load(
        DO + b * sdb + head * sdh + offs_m[:, None] * sdn + offs_e[None, :] * sde, mask=mask, other=0.0
    )
    do = do.to(tl.float32)
    delta = tl.reduce(do * tl.load(OUT + o_off, mask=mask, other=0.0).to(tl.float32), 1, _SUM)
    stat = (b * MAPS * heads + head) * n_ctx + offs_m
    if MAPS == 2:
        delta2 = tl.reduce(do * tl.load(O2 + o_off, mask=mask, other=0.0).to(tl.float32), 1, _SUM)
        delta = delta + tl.load(LAM) * delta2
        tl.store(DELTA + stat + heads * n_ctx, delta2, mask=row_ok)
    tl.store(DELTA + stat, delta, mask=row_ok)


def _bwd_kv(
    Q, K, V, DO, LSE, DELTA, LAM, DK, DV,
    sqb, sqm, sqh, sqn, sqd,
    skb, skm, skh, skn, skd,
    svb, svh, svn, sve,
    sdb, sdh, sdn, sde,
    tkb, tkm, tkh, tkn, tkd,
    tvb, tvh, tvn, tve,
    heads, kv_heads, reps, n_ctx, width, v_width, scale,
    MAPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, PRECISION: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    # DO (B, h, N, e) by strides sd*, DK (B, M, h_kv, N, d) by tk*, DV (B, h_kv, N, e) by tv*.
    pid_n = tl.program_id(0)
    pid_bg = tl.program_id(1)
    b = pid_bg // kv_heads
    group = pid_bg % kv_heads
    qk_scale = scale * LOG2E
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    col_ok = offs_n < n_ctx
    k_off = b * skb + group * skh + offs_n[:, None] * skn + offs_d[None, :] * skd
    k_mask = col_ok[:, None] & (offs_d[None, :] < width)
    v_off = b * svb + group * svh + offs_n[:, None] * svn + offs_e[None, :] * sve
    v_mask = col_ok[:, None] & (offs_e[None, :] < v_width)
    k1 = tl.load(K + k_off, mask=k_mask, other=0.0).to(DOT)
    v_tile = tl.load(V + v_off, mask=v_mask, other=0.0).to(DOT)
    dk1 = tl.full([BLOCK_N, BLOCK_D], 0.0, tl.float32)
    dv = tl.full([BLOCK_N, BLOCK_E], 0.0, tl.float32)
    if MAPS == 2:
        lam = tl.load(LAM)
        k2 = tl.load(K + k_off + skm, mask=k_mask, other=0.0).to(DOT)
        dk2 = tl.full([BLOCK_N, BLOCK_D], 0.0, tl.float32)
    lo = (start_n // BLOCK_M) * BLOCK_M  # causal: query rows from the block's first key on
    for r in range(0, reps):
        head = group * reps + r
        q_base = Q + b * sqb + head * sqh
        do_base = DO + b * sdb + head * sdh
        stat = (b * MAPS * heads + head) * n_ctx  # LSE and DELTA (B, MAPS, h, N) contiguous
        for start_m in range(lo, n_ctx, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            row_ok = offs_m < n_ctx
            q_ptrs = q_base + offs_m[:, None] * sqn + offs_d[None, :] * sqd
            q_mask = row_ok[:, None] & (offs_d[None, :] < width)
            do = tl.load(
                do_base + offs_m[:, None] * sdn + offs_e[None, :] * sde,
                mask=row_ok[:, None] & (offs_e[None, :] < v_width),
                other=0.0,
            ).to(DOT)
            visible = (offs_m[:, None] >= offs_n[None, :]) & col_ok[None, :] & row_ok[:, None]
            dp = tl.dot(do, tl.trans(v_tile), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N), both maps'
            q1 = tl.load(q_ptrs, mask=q_mask, other=0.0).to(DOT)
            lse1 = tl.load(LSE + stat + offs_m, mask=row_ok, other=0.0)
            delta1 = tl.load(DELTA + stat + offs_m, mask=row_ok, other=0.0)
            s1 = tl.dot(q1, tl.trans(k1), input_precision=PRECISION)
            p1 = tl.where(visible, tl.exp2(s1 * qk_scale - lse1[:, None] * LOG2E), 0.0)
            ds1 = p1 * (dp - delta1[:, None])
            dk1 += tl.dot(tl.trans(ds1.to(Q.dtype.element_ty).to(DOT)), q1, input_precision=PRECISION)
            if MAPS == 2:
                q2 = tl.load(q_ptrs + sqm, mask=q_mask, other=0.0).to(DOT)
                lse2 = tl.load(LSE + stat + heads * n_ctx + offs_m, mask=row_ok, other=0.0)
                delta2 = tl.load(DELTA + stat + heads * n_ctx + offs_m, mask=row_ok, other=0.0)
                s2 = tl.dot(q2, tl.trans(k2), input_precision=PRECISION)
                p2 = tl.where(visible, tl.exp2(s2 * qk_scale - lse2[:, None] * LOG2E), 0.0)
                ds2 = -lam * p2 * (dp - delta2[:, None])
                dk2 += tl.dot(tl.trans(ds2.to(Q.dtype.element_ty).to(DOT)), q2, input_precision=PRECISION)
                p1 = p1 - lam * p2  # the map V meets: A1 - λ A2
            dv += tl.dot(tl.trans(p1.to(Q.dtype.element_ty).to(DOT)), do, input_precision=PRECISION)
    dk_ptrs = DK + b * tkb + group * tkh + offs_n[:, None] * tkn + offs_d[None, :] * tkd
    tl.store(dk_ptrs, (dk1 * scale).to(DK.dtype.element_ty), mask=k_mask)
    if MAPS == 2:
        tl.store(dk_ptrs + tkm, (dk2 * scale).to(DK.dtype.element_ty), mask=k_mask)
    dv_ptrs = DV + b * tvb + group * tvh + offs_n[:, None] * tvn + offs_e[None, :] * tve
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=v_mask)


def _bwd_q(
    Q, K, V, DO, LSE, DELTA, LAM, DQ,
    sqb, sqm, sqh, sqn, sqd,
    skb, skm, skh, skn, skd,
    svb, svh, svn, sve,
    sdb, sdh, sdn, sde,
    tqb, tqm, tqh, tqn, tqd,
    heads, reps, n_ctx, width, v_width, scale,
    MAPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, PRECISION: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    # DO (B, h, N, e) by strides sd*, DQ (B, M, h, N, d) by tq*.
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // heads
    head = pid_bh % heads
    group = head // reps
    qk_scale = scale * LOG2E
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    row_ok = offs_m < n_ctx
    q_off = b * sqb + head * sqh + offs_m[:, None] * sqn + offs_d[None, :] * sqd
    q_mask = row_ok[:, None] & (offs_d[None, :] < width)
    stat = (b * MAPS * heads + head) * n_ctx + offs_m
    do = tl.load(
        DO + b * sdb + head * sdh + offs_m[:, None] * sdn + offs_e[None, :] * sde,
        mask=row_ok[:, None] & (offs_e[None, :] < v_width),
        other=0.0,
    ).to(DOT)
    q1 = tl.load(Q + q_off, mask=q_mask, other=0.0).to(DOT)
    lse1 = tl.load(LSE + stat, mask=row_ok, other=0.0)
    delta1 = tl.load(DELTA + stat, mask=row_ok, other=0.0)
    dq1 = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    if MAPS == 2:
        lam = tl.load(LAM)
        q2 = tl.load(Q + q_off + sqm, mask=q_mask, other=0.0).to(DOT)
        lse2 = tl.load(LSE + stat + heads * n_ctx, mask=row_ok, other=0.0)
        delta2 = tl.load(DELTA + stat + heads * n_ctx, mask=row_ok, other=0.0)
        dq2 = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    k_base = K + b * skb + group * skh
    v_base = V + b * svb + group * svh
    hi = tl.minimum((pid_m + 1) * BLOCK_M, n_ctx)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok = offs_n < n_ctx
        k_ptrs = k_base + offs_n[:, None] * skn + offs_d[None, :] * skd
        k_mask = col_ok[:, None] & (offs_d[None, :] < width)
        v_tile = tl.load(
            v_base + offs_n[:, None] * svn + offs_e[None, :] * sve,
            mask=col_ok[:, None] & (offs_e[None, :] < v_width),
            other=0.0,
        ).to(DOT)
        visible = (offs_m[:, None] >= offs_n[None, :]) & col_ok[None, :]
        dp = tl.dot(do, tl.trans(v_tile), input_precision=PRECISION)
        k1 = tl.load(k_ptrs, mask=k_mask, other=0.0).to(DOT)
        s1 = tl.dot(q1, tl.trans(k1), input_precision=PRECISION)
        p1 = tl.where(visible, tl.exp2(s1 * qk_scale - lse1[:, None] * LOG2E), 0.0)
        ds1 = p1 * (dp - delta1[:, None])
        dq1 += tl.dot(ds1.to(Q.dtype.element_ty).to(DOT), k1, input_precision=PRECISION)
        if MAPS == 2:
            k2 = tl.load(k_ptrs + skm, mask=k_mask, other=0.0).to(DOT)
            s2 = tl.dot(q2, tl.trans(k2), input_precision=PRECISION)
            p2 = tl.where(visible, tl.exp2(s2 * qk_scale - lse2[:, None] * LOG2E), 0.0)
            ds2 = -lam * p2 * (dp - delta2[:, None])
            dq2 += tl.dot(ds2.to(Q.dtype.element_ty).to(DOT), k2, input_precision=PRECISION)
    dq_ptrs = DQ + b * tqb + head * tqh + offs_m[:, None] * tqn + offs_d[None, :] * tqd
    tl.store(dq_ptrs, (dq1 * scale).to(DQ.dtype.element_ty), mask=q_mask)
    if MAPS == 2:
        tl.store(dq_ptrs + tqm, (dq2 * scale).to(DQ.dtype.element_ty), mask=q_mask)


@functools.cache
def kernels(interpret: bool):
    """(forward, backward δ, backward kv, backward q) for CPU tensors through Triton's interpreter (`interpret`) or
    compiled for the GPU."""
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        return tuple(InterpretedFunction(f) for f in (_fwd, _bwd_delta, _bwd_kv, _bwd_q))
    return tuple(triton.jit(f) for f in (_fwd, _bwd_delta, _bwd_kv, _bwd_q))
