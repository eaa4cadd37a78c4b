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
  Single pass (FlashAttention-2's structure, `_bwd_kv` with ATOMIC): per key block and kv head, looping
  over the group's query heads and their query tiles once, it writes dK1, dK2, dV and adds each tile's
  dQ1 = dS1 K1, dQ2 = dS2 K2 into a float32 buffer by atomic adds (the caller casts it). Their order
  varies on the GPU, so the sums are not bitwise reproducible: the deterministic path is `_bwd_kv`
  without atomics (dK1, dK2, dV) and `_bwd_q` (per query block and head, dQ1 and dQ2 from a second walk
  over the keys, 4 of its 6 products recomputed).
- the per-head norm (NORM, Eq. 3): a head's whole 2d-wide output row is in one tile, so the forward's
  epilogue rounds O to the inputs' type (what an unfused norm would read), keeps it and the row's
  inverse RMS, and writes O / rms(O) · w · (1 - λ_init). Its backward runs in `_bwd_delta` before δ:
  with x̂ = O · inv and g = dY · w (1 - λ_init), dO = inv (g - x̂ mean(g · x̂)) is written in the
  inputs' type (the gradient the attention's backward reads, rounded as the unfused one is) and δ is
  taken from it; the weight's gradient, Σ dY · x̂, as partial sums per query block.
- masks: each kernel's walk over the other side's tiles is split (`_fwd_tiles`, `_bwd_kv_tiles`,
  `_bwd_q_tiles`, called once per kind of tile) into the tiles the causal diagonal crosses, with the
  mask, and those every row sees whole, with neither the causal mask nor the sequence's end (a query
  tile that passes the end gets its own masked call).

Layouts (any strides): q (B, M, h, N, d) = the maps' queries stacked on dim 1, k (B, M, h_kv, N, d),
v (B, h_kv, N, e); query head i reads kv head i // (h / h_kv). Widths are padded to powers of two (16 at
least, `tl.dot`'s minimum) and masked, as are sequence tails. Products accumulate in float32; float32
inputs multiply in IEEE float32 (no TF32). `DOT` is the type the products' operands are cast to: the
inputs' own (a no-op) on the GPU; float32 for bf16 under the interpreter, whose `tl.dot` multiplies bf16
as raw 16-bit integers (a bf16 product is exact in float32, and the maps are rounded to bf16 first, so the
arithmetic is the GPU's, but for one difference: the interpreter casts float32 to bf16 by truncation
where the GPU rounds to nearest, a step of 2^-8 on about half of the rounded values).

The functions are plain Python: `kernels(interpret)` wraps them with `triton.jit` for CUDA tensors or
Triton's interpreter for CPU tensors. `TRITON_INTERPRET=1` would decide that once, when triton is first
imported (Lightning imports it early), so the kernels call only Triton's built-ins, which the interpreter
patches per launch, and their own tile loops, wrapped the same way as the kernel in a namespace per kind
(`_rebind`): one process runs both kinds, whatever imported triton first.
"""

from __future__ import annotations

import functools
import types

import triton
import triton.language as tl

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)  # module constants a kernel reads are constexpr
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)
# Reductions name their combining functions instead of calling tl.max / tl.sum: those are themselves
# jit functions, decorated when triton was imported, and a kernel run by the interpreter cannot call the
# compiled kind (the interpreter recognises these two and reduces with numpy).
_MAX = tl.standard._elementwise_max
_SUM = tl.standard._sum_combine


def _fwd_tiles(
    acc1, l1, m1, acc2, l2, m2, q1, q2, k_base, v_base, lo, hi, offs_m,
    skm, skn, skd, svn, sve, n_ctx, width, v_width, qk_scale,
    MAPS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
    PRECISION: tl.constexpr, DOT: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    # The forward's key tiles from `lo` to `hi`: the online softmax of both maps against each K/V tile.
    # MASKED: tiles the diagonal (or the sequence's end) crosses; otherwise every entry is visible.
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kt_ptrs = k_base + offs_n[None, :] * skn + offs_d[:, None] * skd  # K^T tile (BLOCK_D, BLOCK_N)
        v_ptrs = v_base + offs_n[:, None] * svn + offs_e[None, :] * sve
        if MASKED:
            col_ok = offs_n < n_ctx
            kt_mask = col_ok[None, :] & (offs_d[:, None] < width)
            v_mask = col_ok[:, None] & (offs_e[None, :] < v_width)
        else:
            kt_mask = offs_d[:, None] < width
            v_mask = offs_e[None, :] < v_width
        v_tile = tl.load(v_ptrs, mask=v_mask, other=0.0).to(DOT)
        k1t = tl.load(kt_ptrs, mask=kt_mask, other=0.0).to(DOT)
        s1 = tl.dot(q1, k1t, input_precision=PRECISION) * qk_scale
        if MASKED:
            visible = (offs_m[:, None] >= offs_n[None, :]) & col_ok[None, :]
            s1 = tl.where(visible, s1, float("-inf"))
        m1_new = tl.maximum(m1, tl.reduce(s1, 1, _MAX))
        p1 = tl.exp2(s1 - m1_new[:, None])
        alpha1 = tl.exp2(m1 - m1_new)
        l1 = l1 * alpha1 + tl.reduce(p1, 1, _SUM)
        acc1 = acc1 * alpha1[:, None] + tl.dot(
            p1.to(k_base.dtype.element_ty).to(DOT), v_tile, input_precision=PRECISION
        )
        m1 = m1_new
        if MAPS == 2:
            k2t = tl.load(kt_ptrs + skm, mask=kt_mask, other=0.0).to(DOT)
            s2 = tl.dot(q2, k2t, input_precision=PRECISION) * qk_scale
            if MASKED:
                s2 = tl.where(visible, s2, float("-inf"))
            m2_new = tl.maximum(m2, tl.reduce(s2, 1, _MAX))
            p2 = tl.exp2(s2 - m2_new[:, None])
            alpha2 = tl.exp2(m2 - m2_new)
            l2 = l2 * alpha2 + tl.reduce(p2, 1, _SUM)
            acc2 = acc2 * alpha2[:, None] + tl.dot(
                p2.to(k_base.dtype.element_ty).to(DOT), v_tile, input_precision=PRECISION
            )
            m2 = m2_new
    return acc1, l1, m1, acc2, l2, m2


def _fwd(
    Q, K, V, OUT, O2, LSE, LAM, PRE, INV, W,
    sqb, sqm, sqh, sqn, sqd,
    skb, skm, skh, skn, skd,
    svb, svh, svn, sve,
    sob, soh, son, soe,
    heads, reps, n_ctx, width, v_width, scale, eps, factor,
    MAPS: tl.constexpr, NORM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, PRECISION: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // heads
    head = pid_bh % heads
    group = head // reps
    qk_scale = scale * LOG2E  # scores in base 2: exp2 is the cheap one
    first = pid_m * BLOCK_M
    offs_m = first + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    row_ok = offs_m < n_ctx
    q_ptrs = Q + b * sqb + head * sqh + offs_m[:, None] * sqn + offs_d[None, :] * sqd
    q_mask = row_ok[:, None] & (offs_d[None, :] < width)
    q1 = tl.load(q_ptrs, mask=q_mask, other=0.0).to(DOT)
    q2 = q1
    if MAPS == 2:
        q2 = tl.load(q_ptrs + sqm, mask=q_mask, other=0.0).to(DOT)
    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l1 = tl.full([BLOCK_M], 0.0, tl.float32)
    acc1 = tl.full([BLOCK_M, BLOCK_E], 0.0, tl.float32)
    m2 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l2 = tl.full([BLOCK_M], 0.0, tl.float32)
    acc2 = tl.full([BLOCK_M, BLOCK_E], 0.0, tl.float32)
    k_base = K + b * skb + group * skh
    v_base = V + b * svb + group * svh
    # Causal: key tiles up to the block's last row. Those that end at or before its first row are seen
    # whole by every row (no mask); the rest cross the diagonal (masked, the sequence's end too).
    whole = (first + 1) // BLOCK_N * BLOCK_N
    hi = tl.minimum(first + BLOCK_M, n_ctx)
    acc1, l1, m1, acc2, l2, m2 = _fwd_tiles(
        acc1, l1, m1, acc2, l2, m2, q1, q2, k_base, v_base, 0, whole, offs_m,
        skm, skn, skd, svn, sve, n_ctx, width, v_width, qk_scale,
        MAPS, BLOCK_N, BLOCK_D, BLOCK_E, PRECISION, DOT, False,
    )  # fmt: skip
    acc1, l1, m1, acc2, l2, m2 = _fwd_tiles(
        acc1, l1, m1, acc2, l2, m2, q1, q2, k_base, v_base, whole, hi, offs_m,
        skm, skn, skd, svn, sve, n_ctx, width, v_width, qk_scale,
        MAPS, BLOCK_N, BLOCK_D, BLOCK_E, PRECISION, DOT, True,
    )  # fmt: skip
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
    if NORM:
        # Eq. 3's per-head RMSNorm times (1 - λ_init) (`factor`) on the head's whole row, from the output
        # rounded to the inputs' type as the unfused norm would read it; the rounded output (PRE, out's
        # layout) and the inverse RMS (INV, (B, h, N) contiguous) are kept for the backward.
        pre = out.to(OUT.dtype.element_ty)
        tl.store(PRE + o_off, pre, mask=o_mask)
        x = pre.to(tl.float32)
        inv = tl.math.rsqrt(tl.reduce(x * x, 1, _SUM) / v_width + eps)
        tl.store(INV + pid_bh * n_ctx + offs_m, inv, mask=row_ok)
        w = tl.load(W + offs_e, mask=offs_e < v_width, other=0.0).to(tl.float32) * factor
        out = x * inv[:, None] * w[None, :]
    tl.store(OUT + o_off, out.to(OUT.dtype.element_ty), mask=o_mask)


def _bwd_delta(
    OUT, O2, DO, DELTA, LAM, INV, W, DPRE, DW,
    sob, soh, son, soe,
    sdb, sdh, sdn, sde,
    heads, n_ctx, v_width, factor,
    MAPS: tl.constexpr, NORM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr,
):  # fmt: skip
    # δ2 = rowsum(dO · O2) and δ1 = rowsum(dO · O) + λ δ2 (δ = rowsum(dO · O) for one map), float32, into
    # DELTA (B, MAPS, h, N) contiguous: one read of dO, O and O2.
    # NORM: OUT is the attention's output before the norm and DO the gradient after it; the norm's
    # backward comes first: with x̂ = O inv and g = dY w (1 - λ_init), dO = inv (g - x̂ mean(g · x̂)),
    # written to DPRE (out's layout, the inputs' type: what the attention's backward reads) and used
    # rounded as such; the weight's gradient, Σ dY x̂ over this block's rows, to DW (one row per
    # program, (B h blocks, BLOCK_E) float32; the caller sums and scales).
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
    out = tl.load(OUT + o_off, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        inv = tl.load(INV + pid_bh * n_ctx + offs_m, mask=row_ok, other=0.0)
        normed = out * inv[:, None]
        w = tl.load(W + offs_e, mask=offs_e < v_width, other=0.0).to(tl.float32) * factor
        tl.store(
            DW + (pid_bh * tl.num_programs(0) + pid_m) * BLOCK_E + offs_e, tl.reduce(do * normed, 0, _SUM)
        )
        g = do * w[None, :]
        mean = tl.reduce(g * normed, 1, _SUM) / v_width
        dpre = ((g - normed * mean[:, None]) * inv[:, None]).to(DPRE.dtype.element_ty)
        tl.store(DPRE + o_off, dpre, mask=mask)
        do = dpre.to(tl.float32)
    delta = tl.reduce(do * out, 1, _SUM)
    stat = (b * MAPS * heads + head) * n_ctx + offs_m
    if MAPS == 2:
        delta2 = tl.reduce(do * tl.load(O2 + o_off, mask=mask, other=0.0).to(tl.float32), 1, _SUM)
        delta = delta + tl.load(LAM) * delta2
        tl.store(DELTA + stat + heads * n_ctx, delta2, mask=row_ok)
    tl.store(DELTA + stat, delta, mask=row_ok)


def _bwd_kv_tiles(
    dk1, dk2, dv, k1, k2, v_tile, lam, q_base, do_base, dq_base, lse_base, delta_base, lo, hi, offs_n,
    sqm, sqn, sqd, sdn, sde, tqm, tqn, tqd, map_stride, n_ctx, width, v_width, qk_scale, scale,
    MAPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
    PRECISION: tl.constexpr, DOT: tl.constexpr, MASKED: tl.constexpr, ATOMIC: tl.constexpr,
):  # fmt: skip
    # One key block against one query head's query tiles from `lo` to `hi`: dK1, dK2 and dV accumulate;
    # ATOMIC also adds the block's share of dQ1 and dQ2 (scaled) into the float32 buffer at dq_base.
    # LSE and DELTA rows of map 1 at lse_base and delta_base (map 2: + map_stride). MASKED: the tiles
    # the diagonal or the sequence's end crosses; the others are seen whole.
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_ptrs = q_base + offs_m[:, None] * sqn + offs_d[None, :] * sqd
        if MASKED:
            row_ok = offs_m < n_ctx
            q_mask = row_ok[:, None] & (offs_d[None, :] < width)
            do_mask = row_ok[:, None] & (offs_e[None, :] < v_width)
            visible = (offs_m[:, None] >= offs_n[None, :]) & (offs_n[None, :] < n_ctx) & row_ok[:, None]
            lse1 = tl.load(lse_base + offs_m, mask=row_ok, other=0.0)
            delta1 = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
        else:
            q_mask = offs_d[None, :] < width
            do_mask = offs_e[None, :] < v_width
            lse1 = tl.load(lse_base + offs_m)
            delta1 = tl.load(delta_base + offs_m)
        do = tl.load(do_base + offs_m[:, None] * sdn + offs_e[None, :] * sde, mask=do_mask, other=0.0)
        do = do.to(DOT)
        dp = tl.dot(do, tl.trans(v_tile), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N), both maps'
        q1 = tl.load(q_ptrs, mask=q_mask, other=0.0).to(DOT)
        s1 = tl.dot(q1, tl.trans(k1), input_precision=PRECISION)
        p1 = tl.exp2(s1 * qk_scale - lse1[:, None] * LOG2E)
        if MASKED:
            p1 = tl.where(visible, p1, 0.0)
        ds1 = (p1 * (dp - delta1[:, None])).to(q_base.dtype.element_ty).to(DOT)
        dk1 += tl.dot(tl.trans(ds1), q1, input_precision=PRECISION)
        if ATOMIC:
            dq1 = tl.dot(ds1, k1, input_precision=PRECISION) * scale
            tl.atomic_add(
                dq_base + offs_m[:, None] * tqn + offs_d[None, :] * tqd, dq1, mask=q_mask, sem="relaxed"
            )
        if MAPS == 2:
            q2 = tl.load(q_ptrs + sqm, mask=q_mask, other=0.0).to(DOT)
            if MASKED:
                lse2 = tl.load(lse_base + map_stride + offs_m, mask=row_ok, other=0.0)
                delta2 = tl.load(delta_base + map_stride + offs_m, mask=row_ok, other=0.0)
            else:
                lse2 = tl.load(lse_base + map_stride + offs_m)
                delta2 = tl.load(delta_base + map_stride + offs_m)
            s2 = tl.dot(q2, tl.trans(k2), input_precision=PRECISION)
            p2 = tl.exp2(s2 * qk_scale - lse2[:, None] * LOG2E)
            if MASKED:
                p2 = tl.where(visible, p2, 0.0)
            ds2 = (-lam * p2 * (dp - delta2[:, None])).to(q_base.dtype.element_ty).to(DOT)
            dk2 += tl.dot(tl.trans(ds2), q2, input_precision=PRECISION)
            if ATOMIC:
                dq2 = tl.dot(ds2, k2, input_precision=PRECISION) * scale
                tl.atomic_add(
                    dq_base + tqm + offs_m[:, None] * tqn + offs_d[None, :] * tqd,
                    dq2,
                    mask=q_mask,
                    sem="relaxed",
                )
            p1 = p1 - lam * p2  # the map V meets: A1 - λ A2
        dv += tl.dot(tl.trans(p1.to(q_base.dtype.element_ty).to(DOT)), do, input_precision=PRECISION)
    return dk1, dk2, dv


def _bwd_kv(
    Q, K, V, DO, LSE, DELTA, LAM, DK, DV, DQ,
    sqb, sqm, sqh, sqn, sqd,
    skb, skm, skh, skn, skd,
    svb, svh, svn, sve,
    sdb, sdh, sdn, sde,
    tkb, tkm, tkh, tkn, tkd,
    tvb, tvh, tvn, tve,
    tqb, tqm, tqh, tqn, tqd,
    heads, kv_heads, reps, n_ctx, width, v_width, scale,
    MAPS: tl.constexpr, ATOMIC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, PRECISION: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    # DO (B, h, N, e) by strides sd*, DK (B, M, h_kv, N, d) by tk*, DV (B, h_kv, N, e) by tv*; ATOMIC:
    # DQ (B, M, h, N, d) float32 by tq*, zeroed by the caller, receives dQ by atomic adds.
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
    k2 = k1
    v_tile = tl.load(V + v_off, mask=v_mask, other=0.0).to(DOT)
    dk1 = tl.full([BLOCK_N, BLOCK_D], 0.0, tl.float32)
    dk2 = tl.full([BLOCK_N, BLOCK_D], 0.0, tl.float32)
    dv = tl.full([BLOCK_N, BLOCK_E], 0.0, tl.float32)
    lam = 0.0
    if MAPS == 2:
        lam = tl.load(LAM)
        k2 = tl.load(K + k_off + skm, mask=k_mask, other=0.0).to(DOT)
    # Causal: query rows from the block's first key on. The query tiles that start at or after its last
    # key see it whole (no mask) unless they pass the sequence's end; the first ones cross the diagonal.
    lo = start_n // BLOCK_M * BLOCK_M
    whole = (start_n + BLOCK_N - 1 + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    inside = n_ctx // BLOCK_M * BLOCK_M  # query tiles that end inside the sequence
    diagonal = tl.minimum(whole, n_ctx)
    tail = tl.maximum(whole, inside)
    for r in range(0, reps):
        head = group * reps + r
        q_base = Q + b * sqb + head * sqh
        do_base = DO + b * sdb + head * sdh
        dq_base = DQ + b * tqb + head * tqh
        stat = (b * MAPS * heads + head) * n_ctx  # LSE and DELTA (B, MAPS, h, N) contiguous
        dk1, dk2, dv = _bwd_kv_tiles(
            dk1, dk2, dv, k1, k2, v_tile, lam, q_base, do_base, dq_base, LSE + stat, DELTA + stat,
            lo, diagonal, offs_n, sqm, sqn, sqd, sdn, sde, tqm, tqn, tqd, heads * n_ctx,
            n_ctx, width, v_width, qk_scale, scale,
            MAPS, BLOCK_M, BLOCK_D, BLOCK_E, PRECISION, DOT, True, ATOMIC,
        )  # fmt: skip
        dk1, dk2, dv = _bwd_kv_tiles(
            dk1, dk2, dv, k1, k2, v_tile, lam, q_base, do_base, dq_base, LSE + stat, DELTA + stat,
            whole, inside, offs_n, sqm, sqn, sqd, sdn, sde, tqm, tqn, tqd, heads * n_ctx,
            n_ctx, width, v_width, qk_scale, scale,
            MAPS, BLOCK_M, BLOCK_D, BLOCK_E, PRECISION, DOT, False, ATOMIC,
        )  # fmt: skip
        dk1, dk2, dv = _bwd_kv_tiles(
            dk1, dk2, dv, k1, k2, v_tile, lam, q_base, do_base, dq_base, LSE + stat, DELTA + stat,
            tail, n_ctx, offs_n, sqm, sqn, sqd, sdn, sde, tqm, tqn, tqd, heads * n_ctx,
            n_ctx, width, v_width, qk_scale, scale,
            MAPS, BLOCK_M, BLOCK_D, BLOCK_E, PRECISION, DOT, True, ATOMIC,
        )  # fmt: skip
    dk_ptrs = DK + b * tkb + group * tkh + offs_n[:, None] * tkn + offs_d[None, :] * tkd
    tl.store(dk_ptrs, (dk1 * scale).to(DK.dtype.element_ty), mask=k_mask)
    if MAPS == 2:
        tl.store(dk_ptrs + tkm, (dk2 * scale).to(DK.dtype.element_ty), mask=k_mask)
    dv_ptrs = DV + b * tvb + group * tvh + offs_n[:, None] * tvn + offs_e[None, :] * tve
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=v_mask)


def _bwd_q_tiles(
    dq1, dq2, q1, q2, do, lse1, lse2, delta1, delta2, lam, k_base, v_base, lo, hi, offs_m,
    skm, skn, skd, svn, sve, n_ctx, width, v_width, qk_scale,
    MAPS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
    PRECISION: tl.constexpr, DOT: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    # One query block against the key tiles from `lo` to `hi`: dQ1 and dQ2 accumulate. MASKED: the tiles
    # the diagonal or the sequence's end crosses.
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_ptrs = k_base + offs_n[:, None] * skn + offs_d[None, :] * skd
        v_ptrs = v_base + offs_n[:, None] * svn + offs_e[None, :] * sve
        if MASKED:
            col_ok = offs_n < n_ctx
            k_mask = col_ok[:, None] & (offs_d[None, :] < width)
            v_mask = col_ok[:, None] & (offs_e[None, :] < v_width)
            visible = (offs_m[:, None] >= offs_n[None, :]) & col_ok[None, :]
        else:
            k_mask = offs_d[None, :] < width
            v_mask = offs_e[None, :] < v_width
        v_tile = tl.load(v_ptrs, mask=v_mask, other=0.0).to(DOT)
        dp = tl.dot(do, tl.trans(v_tile), input_precision=PRECISION)
        k1 = tl.load(k_ptrs, mask=k_mask, other=0.0).to(DOT)
        s1 = tl.dot(q1, tl.trans(k1), input_precision=PRECISION)
        p1 = tl.exp2(s1 * qk_scale - lse1[:, None] * LOG2E)
        if MASKED:
            p1 = tl.where(visible, p1, 0.0)
        ds1 = p1 * (dp - delta1[:, None])
        dq1 += tl.dot(ds1.to(k_base.dtype.element_ty).to(DOT), k1, input_precision=PRECISION)
        if MAPS == 2:
            k2 = tl.load(k_ptrs + skm, mask=k_mask, other=0.0).to(DOT)
            s2 = tl.dot(q2, tl.trans(k2), input_precision=PRECISION)
            p2 = tl.exp2(s2 * qk_scale - lse2[:, None] * LOG2E)
            if MASKED:
                p2 = tl.where(visible, p2, 0.0)
            ds2 = -lam * p2 * (dp - delta2[:, None])
            dq2 += tl.dot(ds2.to(k_base.dtype.element_ty).to(DOT), k2, input_precision=PRECISION)
    return dq1, dq2


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
    first = pid_m * BLOCK_M
    offs_m = first + tl.arange(0, BLOCK_M)
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
    dq2 = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    q2, lse2, delta2, lam = q1, lse1, delta1, 0.0
    if MAPS == 2:
        lam = tl.load(LAM)
        q2 = tl.load(Q + q_off + sqm, mask=q_mask, other=0.0).to(DOT)
        lse2 = tl.load(LSE + stat + heads * n_ctx, mask=row_ok, other=0.0)
        delta2 = tl.load(DELTA + stat + heads * n_ctx, mask=row_ok, other=0.0)
    k_base = K + b * skb + group * skh
    v_base = V + b * svb + group * svh
    whole = (first + 1) // BLOCK_N * BLOCK_N  # as in the forward
    hi = tl.minimum(first + BLOCK_M, n_ctx)
    dq1, dq2 = _bwd_q_tiles(
        dq1, dq2, q1, q2, do, lse1, lse2, delta1, delta2, lam, k_base, v_base, 0, whole, offs_m,
        skm, skn, skd, svn, sve, n_ctx, width, v_width, qk_scale,
        MAPS, BLOCK_N, BLOCK_D, BLOCK_E, PRECISION, DOT, False,
    )  # fmt: skip
    dq1, dq2 = _bwd_q_tiles(
        dq1, dq2, q1, q2, do, lse1, lse2, delta1, delta2, lam, k_base, v_base, whole, hi, offs_m,
        skm, skn, skd, svn, sve, n_ctx, width, v_width, qk_scale,
        MAPS, BLOCK_N, BLOCK_D, BLOCK_E, PRECISION, DOT, True,
    )  # fmt: skip
    dq_ptrs = DQ + b * tqb + head * tqh + offs_m[:, None] * tqn + offs_d[None, :] * tqd
    tl.store(dq_ptrs, (dq1 * scale).to(DQ.dtype.element_ty), mask=q_mask)
    if MAPS == 2:
        tl.store(dq_ptrs + tqm, (dq2 * scale).to(DQ.dtype.element_ty), mask=q_mask)


_TILES = (_fwd_tiles, _bwd_kv_tiles, _bwd_q_tiles)  # called from the kernels
_KERNELS = (_fwd, _bwd_delta, _bwd_kv, _bwd_q)


@functools.cache
def kernels(interpret: bool):
    """(forward, backward δ, backward kv, backward q) for CPU tensors through Triton's interpreter
    (`interpret`) or compiled for the GPU.

    A kernel calls its tile loops by their global names, which must be wrapped the same way as the
    kernel (the compiler calls only jit functions, the interpreter only interpreted ones), and one
    process may run both kinds: each kind gets copies of the functions whose globals name its own."""
    from triton.runtime.interpreter import InterpretedFunction

    wrap = InterpretedFunction if interpret else triton.jit
    namespace = dict(globals())
    for f in _TILES:
        namespace[f.__name__] = wrap(_rebind(f, namespace))
    return tuple(wrap(_rebind(f, namespace)) for f in _KERNELS)


def _rebind(f: types.FunctionType, namespace: dict) -> types.FunctionType:
    """`f` reading its globals from `namespace` (same code, so Triton reads the same source)."""
    copy = types.FunctionType(f.__code__, namespace, f.__name__, f.__defaults__, f.__closure__)
    copy.__module__, copy.__qualname__, copy.__doc__ = f.__module__, f.__qualname__, f.__doc__
    return copy
