"""The `triton` backend's backward kernels and their tile loops: δ (and the fused norm's backward), the
single pass over the key blocks (dK1, dK2, dV, and dQ by atomic adds) or, deterministic, that pass
without atomics and a second over the query blocks for dQ (the math: components/attention/triton/kernels.py,
which wraps these plain functions for the GPU or Triton's interpreter).
"""

from __future__ import annotations

import triton.language as tl

from components.attention.triton.forward import _SUM, LOG2E, _key_tile, _program, _query_block


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
    pid_m, pid_bh, b, head = _program(heads, False)
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
    # Transposed, as in Triton's fused-attention tutorial: S^T = K Q^T, dP^T = V dO^T, so P^T and dS^T
    # are (key rows, query rows), the layout dV += P^T dO and dK += dS^T Q read from registers; only the
    # single pass's dQ = dS K reads a transpose. Every product but dQ has the key block's rows.
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    elem = q_base.dtype.element_ty
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        qt_ptrs = q_base + offs_m[None, :] * sqn + offs_d[:, None] * sqd  # Q^T tile (BLOCK_D, BLOCK_M)
        if MASKED:
            row_ok = offs_m < n_ctx
            qt_mask = row_ok[None, :] & (offs_d[:, None] < width)
            do_mask = row_ok[:, None] & (offs_e[None, :] < v_width)
            dq_mask = row_ok[:, None] & (offs_d[None, :] < width)
            visible = (offs_m[None, :] >= offs_n[:, None]) & (offs_n[:, None] < n_ctx) & row_ok[None, :]
            lse1 = tl.load(lse_base + offs_m, mask=row_ok, other=0.0)
            delta1 = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
        else:
            qt_mask = offs_d[:, None] < width
            do_mask = offs_e[None, :] < v_width
            dq_mask = offs_d[None, :] < width
            lse1 = tl.load(lse_base + offs_m)
            delta1 = tl.load(delta_base + offs_m)
        do = tl.load(do_base + offs_m[:, None] * sdn + offs_e[None, :] * sde, mask=do_mask, other=0.0)
        do = do.to(DOT)
        dpt = tl.dot(v_tile, tl.trans(do), input_precision=PRECISION)  # (BLOCK_N, BLOCK_M), both maps'
        q1t = tl.load(qt_ptrs, mask=qt_mask, other=0.0).to(DOT)
        s1t = tl.dot(k1, q1t, input_precision=PRECISION)
        p1t = tl.exp2(s1t * qk_scale - (lse1 * LOG2E)[None, :])  # the log-sum-exp in base 2, per row
        if MASKED:
            p1t = tl.where(visible, p1t, 0.0)
        ds1t = (p1t * (dpt - delta1[None, :])).to(elem).to(DOT)
        dk1 += tl.dot(ds1t, tl.trans(q1t), input_precision=PRECISION)
        if ATOMIC:
            dq1 = tl.dot(tl.trans(ds1t), k1, input_precision=PRECISION) * scale
            tl.atomic_add(
                dq_base + offs_m[:, None] * tqn + offs_d[None, :] * tqd,
                dq1,
                mask=dq_mask,
                sem="relaxed",
            )
        if MAPS == 2:
            q2t = tl.load(qt_ptrs + sqm, mask=qt_mask, other=0.0).to(DOT)
            if MASKED:
                lse2 = tl.load(lse_base + map_stride + offs_m, mask=row_ok, other=0.0)
                delta2 = tl.load(delta_base + map_stride + offs_m, mask=row_ok, other=0.0)
            else:
                lse2 = tl.load(lse_base + map_stride + offs_m)
                delta2 = tl.load(delta_base + map_stride + offs_m)
            s2t = tl.dot(k2, q2t, input_precision=PRECISION)
            p2t = tl.exp2(s2t * qk_scale - (lse2 * LOG2E)[None, :])
            if MASKED:
                p2t = tl.where(visible, p2t, 0.0)
            ds2t = (-lam * p2t * (dpt - delta2[None, :])).to(elem).to(DOT)
            dk2 += tl.dot(ds2t, tl.trans(q2t), input_precision=PRECISION)
            if ATOMIC:
                dq2 = tl.dot(tl.trans(ds2t), k2, input_precision=PRECISION) * scale
                tl.atomic_add(
                    dq_base + tqm + offs_m[:, None] * tqn + offs_d[None, :] * tqd,
                    dq2,
                    mask=dq_mask,
                    sem="relaxed",
                )
            p1t = p1t - lam * p2t  # the map V meets: A1 - λ A2
        dv += tl.dot(p1t.to(elem).to(DOT), do, input_precision=PRECISION)
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
    pid_n, _, b, group = _program(kv_heads, False)
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
    for start_n in range(lo, hi, BLOCK_N):
        k1, k2, v_tile, visible = _key_tile(
            k_base, v_base, start_n, offs_m, skm, skn, skd, svn, sve, n_ctx, width, v_width,
            MAPS, BLOCK_N, BLOCK_D, BLOCK_E, DOT, MASKED,
        )  # fmt: skip
        dp = tl.dot(do, tl.trans(v_tile), input_precision=PRECISION)
        s1 = tl.dot(q1, tl.trans(k1), input_precision=PRECISION)
        p1 = tl.exp2(s1 * qk_scale - lse1[:, None] * LOG2E)
        if MASKED:
            p1 = tl.where(visible, p1, 0.0)
        ds1 = p1 * (dp - delta1[:, None])
        dq1 += tl.dot(ds1.to(k_base.dtype.element_ty).to(DOT), k1, input_precision=PRECISION)
        if MAPS == 2:
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
    _, b, head, group, first, offs_m, row_ok, _, q_mask, q1, q2 = _query_block(
        Q, heads, reps, n_ctx, width, sqb, sqm, sqh, sqn, sqd, MAPS, BLOCK_M, BLOCK_D, DOT
    )  # fmt: skip
    qk_scale = scale * LOG2E
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    stat = (b * MAPS * heads + head) * n_ctx + offs_m
    do = tl.load(
        DO + b * sdb + head * sdh + offs_m[:, None] * sdn + offs_e[None, :] * sde,
        mask=row_ok[:, None] & (offs_e[None, :] < v_width),
        other=0.0,
    ).to(DOT)
    lse1 = tl.load(LSE + stat, mask=row_ok, other=0.0)
    delta1 = tl.load(DELTA + stat, mask=row_ok, other=0.0)
    dq1 = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    dq2 = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    lse2, delta2, lam = lse1, delta1, 0.0
    if MAPS == 2:
        lam = tl.load(LAM)
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
