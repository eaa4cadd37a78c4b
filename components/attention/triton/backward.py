"""The `triton` backend's backward kernels and their tile loops: δ (and the fused norm's backward), the
single pass over the key blocks (dK1, dK2, dV, and dQ by atomic adds) or, deterministic, that pass
without atomics and a second over the query blocks for dQ (the math: components/attention/triton/kernels.py,
which wraps these plain functions for the GPU or Triton's interpreter).
"""

from __future__ import annotations

import triton.language as tl

from components.attention.triton.forward import (
    _SUM,
    LOG2E,
    _key_tile,
    _kv_sources,
    _map_rows,
    _program,
    _query_block,
    _rows,
    _store_rows,
    _tile,
)


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


def _bwd_kv_map(
    dk, k, dpt, lam, Q, q_src, dq_base, lse_base, delta_base, start_m, offs_m, row_ok, visible,
    sqn, sqd, tqn, tqd, n_ctx, width, qk_scale, scale,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, DOT: tl.constexpr,
    MASKED: tl.constexpr, ATOMIC: tl.constexpr, SECOND: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    # One map's share of a query tile, transposed (key rows, query rows): P^T from the log-sum-exp (in
    # base 2), dS^T = P^T (dP^T - δ) (map 2, SECOND: -λ P^T (dP^T - δ2)), dK += dS^T Q and, ATOMIC,
    # dQ = dS K added into the float32 buffer. Returns dK and P^T (the map V meets).
    offs_d = tl.arange(0, BLOCK_D)
    if MASKED:
        lse = tl.load(lse_base + offs_m, mask=row_ok, other=0.0)
        delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
    else:
        lse = tl.load(lse_base + offs_m)
        delta = tl.load(delta_base + offs_m)
    # Q loaded as its rows (what a tensor descriptor gives) and transposed in registers for S^T = K Q^T.
    q = _tile(q_src, start_m, n_ctx, width, sqn, sqd, BLOCK_M, BLOCK_D, TMA, MASKED).to(DOT)
    pt = tl.exp2(tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale - (lse * LOG2E)[None, :])
    if MASKED:
        pt = tl.where(visible, pt, 0.0)
    scaled = pt
    if SECOND:
        scaled = -lam * pt
    dst = (scaled * (dpt - delta[None, :])).to(Q.dtype.element_ty).to(DOT)
    dk += tl.dot(dst, q, input_precision=PRECISION)
    if ATOMIC:
        dq = tl.dot(tl.trans(dst), k, input_precision=PRECISION) * scale
        dq_mask = offs_d[None, :] < width
        if MASKED:
            dq_mask = row_ok[:, None] & dq_mask
        dq_ptrs = dq_base + offs_m[:, None] * tqn + offs_d[None, :] * tqd
        tl.atomic_add(dq_ptrs, dq, mask=dq_mask, sem="relaxed")
    return dk, pt


def _bwd_kv_tiles(
    dk1, dk2, dv, k1, k2, v_tile, lam, Q, q1_src, q2_src, do_src, dq_base, lse_base, delta_base,
    lo, hi, offs_n, sqn, sqd, sdn, sde, tqm, tqn, tqd, map_stride, n_ctx, width, v_width, qk_scale, scale,
    MAPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
    PRECISION: tl.constexpr, DOT: tl.constexpr, MASKED: tl.constexpr, ATOMIC: tl.constexpr,
    TMA: tl.constexpr,
):  # fmt: skip
    # One key block against one query head's query tiles from `lo` to `hi` (Q1, Q2, dO from their
    # sources, forward.py's `_rows`): dK1, dK2 and dV accumulate; ATOMIC also adds the block's share of
    # dQ1 and dQ2 (scaled) into the float32 buffer at dq_base. LSE and DELTA rows of map 1 at lse_base
    # and delta_base (map 2: + map_stride). MASKED: the tiles the diagonal or the sequence's end
    # crosses; the others are seen whole.
    # Transposed, as in Triton's fused-attention tutorial: S^T = K Q^T, dP^T = V dO^T, so P^T and dS^T
    # are (key rows, query rows), the layout dV += P^T dO and dK += dS^T Q read from registers; only the
    # single pass's dQ = dS K reads a transpose. Every product but dQ has the key block's rows.
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < n_ctx
        visible = 0  # every entry is seen
        if MASKED:
            visible = (offs_m[None, :] >= offs_n[:, None]) & (offs_n[:, None] < n_ctx) & row_ok[None, :]
        do = _tile(do_src, start_m, n_ctx, v_width, sdn, sde, BLOCK_M, BLOCK_E, TMA, MASKED).to(DOT)
        dpt = tl.dot(v_tile, tl.trans(do), input_precision=PRECISION)  # (BLOCK_N, BLOCK_M), both maps'
        dk1, p1t = _bwd_kv_map(
            dk1, k1, dpt, lam, Q, q1_src, dq_base, lse_base, delta_base, start_m, offs_m, row_ok, visible,
            sqn, sqd, tqn, tqd, n_ctx, width, qk_scale, scale,
            BLOCK_M, BLOCK_D, PRECISION, DOT, MASKED, ATOMIC, False, TMA,
        )  # fmt: skip
        if MAPS == 2:
            dk2, p2t = _bwd_kv_map(
                dk2, k2, dpt, lam, Q, q2_src, dq_base + tqm, lse_base + map_stride, delta_base + map_stride,
                start_m, offs_m, row_ok, visible, sqn, sqd, tqn, tqd, n_ctx, width, qk_scale, scale,
                BLOCK_M, BLOCK_D, PRECISION, DOT, MASKED, ATOMIC, True, TMA,
            )  # fmt: skip
            p1t = p1t - lam * p2t  # the map V meets: A1 - λ A2
        dv += tl.dot(p1t.to(Q.dtype.element_ty).to(DOT), do, input_precision=PRECISION)
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
    TMA: tl.constexpr,
):  # fmt: skip
    # DO (B, h, N, e) by strides sd*, DK (B, M, h_kv, N, d) by tk*, DV (B, h_kv, N, e) by tv*; ATOMIC:
    # DQ (B, M, h, N, d) float32 by tq*, zeroed by the caller, receives dQ by atomic adds. TMA: Q, K, V
    # and dO tiles by tensor descriptors (`_rows`), else by pointers.
    pid_n, _, b, group = _program(kv_heads, False)
    qk_scale = scale * LOG2E
    start_n = pid_n * BLOCK_N
    k1_src, k2_src, v_src = _kv_sources(
        K, V, b, group, n_ctx, width, v_width, skb, skm, skh, skn, svb, svh, svn,
        MAPS, BLOCK_N, BLOCK_D, BLOCK_E, TMA,
    )  # fmt: skip
    k1 = _tile(k1_src, start_n, n_ctx, width, skn, skd, BLOCK_N, BLOCK_D, TMA, True).to(DOT)
    k2 = k1
    v_tile = _tile(v_src, start_n, n_ctx, v_width, svn, sve, BLOCK_N, BLOCK_E, TMA, True).to(DOT)
    dk1 = tl.full([BLOCK_N, BLOCK_D], 0.0, tl.float32)
    dk2 = tl.full([BLOCK_N, BLOCK_D], 0.0, tl.float32)
    dv = tl.full([BLOCK_N, BLOCK_E], 0.0, tl.float32)
    lam = 0.0
    if MAPS == 2:
        lam = tl.load(LAM)
        k2 = _tile(k2_src, start_n, n_ctx, width, skn, skd, BLOCK_N, BLOCK_D, TMA, True).to(DOT)
    # Causal: query rows from the block's first key on. The query tiles that start at or after its last
    # key see it whole (no mask) unless they pass the sequence's end; the first ones cross the diagonal.
    lo = start_n // BLOCK_M * BLOCK_M
    whole = (start_n + BLOCK_N - 1 + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    inside = n_ctx // BLOCK_M * BLOCK_M  # query tiles that end inside the sequence
    for r in range(0, reps):
        head = group * reps + r
        q_base = Q + b * sqb + head * sqh
        q1_src, q2_src = _map_rows(q_base, sqm, n_ctx, width, sqn, BLOCK_M, BLOCK_D, MAPS, TMA)
        do_src = _rows(DO + b * sdb + head * sdh, n_ctx, v_width, sdn, BLOCK_M, BLOCK_E, TMA)
        stat = (b * MAPS * heads + head) * n_ctx  # LSE and DELTA (B, MAPS, h, N) contiguous
        # The tiles the diagonal crosses (masked), those seen whole, those past the sequence's end (masked).
        for part in tl.static_range(3):
            if part == 0:
                part_lo, part_hi = lo, tl.minimum(whole, n_ctx)
            elif part == 1:
                part_lo, part_hi = whole, inside
            else:
                part_lo, part_hi = tl.maximum(whole, inside), n_ctx
            dk1, dk2, dv = _bwd_kv_tiles(
                dk1, dk2, dv, k1, k2, v_tile, lam, Q, q1_src, q2_src, do_src, DQ + b * tqb + head * tqh,
                LSE + stat, DELTA + stat, part_lo, part_hi, start_n + tl.arange(0, BLOCK_N),
                sqn, sqd, sdn, sde, tqm, tqn, tqd, heads * n_ctx, n_ctx, width, v_width, qk_scale, scale,
                MAPS, BLOCK_M, BLOCK_D, BLOCK_E, PRECISION, DOT, part != 1, ATOMIC, TMA,
            )  # fmt: skip
    _store_rows(DK + b * tkb + group * tkh, dk1 * scale, start_n, n_ctx, width, tkn, tkd, BLOCK_N, BLOCK_D)
    if MAPS == 2:
        _store_rows(
            DK + b * tkb + group * tkh + tkm, dk2 * scale, start_n, n_ctx, width, tkn, tkd, BLOCK_N, BLOCK_D
        )
    _store_rows(DV + b * tvb + group * tvh, dv, start_n, n_ctx, v_width, tvn, tve, BLOCK_N, BLOCK_E)


def _bwd_q_tiles(
    dq1, dq2, q1, q2, do, lse1, lse2, delta1, delta2, lam, K, k1_src, k2_src, v_src, lo, hi, offs_m,
    skn, skd, svn, sve, n_ctx, width, v_width, qk_scale,
    MAPS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
    PRECISION: tl.constexpr, DOT: tl.constexpr, MASKED: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    # One query block against the key tiles from `lo` to `hi`: dQ1 and dQ2 accumulate. MASKED: the tiles
    # the diagonal or the sequence's end crosses.
    for start_n in range(lo, hi, BLOCK_N):
        k1, k2, v_tile, visible = _key_tile(
            k1_src, k2_src, v_src, start_n, offs_m, skn, skd, svn, sve, n_ctx, width, v_width,
            MAPS, BLOCK_N, BLOCK_D, BLOCK_E, DOT, MASKED, TMA,
        )  # fmt: skip
        dp = tl.dot(do, tl.trans(v_tile), input_precision=PRECISION)
        s1 = tl.dot(q1, tl.trans(k1), input_precision=PRECISION)
        p1 = tl.exp2(s1 * qk_scale - lse1[:, None] * LOG2E)
        if MASKED:
            p1 = tl.where(visible, p1, 0.0)
        ds1 = p1 * (dp - delta1[:, None])
        dq1 += tl.dot(ds1.to(K.dtype.element_ty).to(DOT), k1, input_precision=PRECISION)
        if MAPS == 2:
            s2 = tl.dot(q2, tl.trans(k2), input_precision=PRECISION)
            p2 = tl.exp2(s2 * qk_scale - lse2[:, None] * LOG2E)
            if MASKED:
                p2 = tl.where(visible, p2, 0.0)
            ds2 = -lam * p2 * (dp - delta2[:, None])
            dq2 += tl.dot(ds2.to(K.dtype.element_ty).to(DOT), k2, input_precision=PRECISION)
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
    TMA: tl.constexpr,
):  # fmt: skip
    # DO (B, h, N, e) by strides sd*, DQ (B, M, h, N, d) by tq*. TMA: Q, K, V and dO tiles by tensor
    # descriptors (`_rows`), else by pointers.
    _, b, head, group, first, offs_m, row_ok, q1, q2 = _query_block(
        Q, heads, reps, n_ctx, width, sqb, sqm, sqh, sqn, sqd, MAPS, BLOCK_M, BLOCK_D, DOT, TMA
    )  # fmt: skip
    qk_scale = scale * LOG2E
    stat = (b * MAPS * heads + head) * n_ctx + offs_m
    do = _rows(DO + b * sdb + head * sdh, n_ctx, v_width, sdn, BLOCK_M, BLOCK_E, TMA)
    do = _tile(do, first, n_ctx, v_width, sdn, sde, BLOCK_M, BLOCK_E, TMA, True).to(DOT)
    lse1 = tl.load(LSE + stat, mask=row_ok, other=0.0)
    delta1 = tl.load(DELTA + stat, mask=row_ok, other=0.0)
    dq1 = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    dq2 = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    lse2, delta2, lam = lse1, delta1, 0.0
    if MAPS == 2:
        lam = tl.load(LAM)
        lse2 = tl.load(LSE + stat + heads * n_ctx, mask=row_ok, other=0.0)
        delta2 = tl.load(DELTA + stat + heads * n_ctx, mask=row_ok, other=0.0)
    k1_src, k2_src, v_src = _kv_sources(
        K, V, b, group, n_ctx, width, v_width, skb, skm, skh, skn, svb, svh, svn,
        MAPS, BLOCK_N, BLOCK_D, BLOCK_E, TMA,
    )  # fmt: skip
    whole = (first + 1) // BLOCK_N * BLOCK_N  # as in the forward
    hi = tl.minimum(first + BLOCK_M, n_ctx)
    dq1, dq2 = _bwd_q_tiles(
        dq1, dq2, q1, q2, do, lse1, lse2, delta1, delta2, lam, K, k1_src, k2_src, v_src, 0, whole, offs_m,
        skn, skd, svn, sve, n_ctx, width, v_width, qk_scale,
        MAPS, BLOCK_N, BLOCK_D, BLOCK_E, PRECISION, DOT, False, TMA,
    )  # fmt: skip
    dq1, dq2 = _bwd_q_tiles(
        dq1, dq2, q1, q2, do, lse1, lse2, delta1, delta2, lam, K, k1_src, k2_src, v_src, whole, hi, offs_m,
        skn, skd, svn, sve, n_ctx, width, v_width, qk_scale,
        MAPS, BLOCK_N, BLOCK_D, BLOCK_E, PRECISION, DOT, True, TMA,
    )  # fmt: skip
    dq_base = DQ + b * tqb + head * tqh
    _store_rows(dq_base, dq1 * scale, first, n_ctx, width, tqn, tqd, BLOCK_M, BLOCK_D)
    if MAPS == 2:
        _store_rows(dq_base + tqm, dq2 * scale, first, n_ctx, width, tqn, tqd, BLOCK_M, BLOCK_D)
