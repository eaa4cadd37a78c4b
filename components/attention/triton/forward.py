"""The `triton` backend's forward kernel and its tile loop (the math: components/attention/triton/kernels.py,
which wraps these plain functions for the GPU or Triton's interpreter), and the constants both directions
read.
"""

from __future__ import annotations

import triton.language as tl

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)  # module constants a kernel reads are constexpr
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)
# Reductions name their combining functions instead of calling tl.max / tl.sum: those are themselves
# jit functions, decorated when triton was imported, and a kernel run by the interpreter cannot call the
# compiled kind (the interpreter recognises these two and reduces with numpy).
_MAX = tl.standard._elementwise_max
_SUM = tl.standard._sum_combine


def _softmax_pv(
    acc, total, m, s, v_tile, visible, k_base, qk_scale,
    PRECISION: tl.constexpr, DOT: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    # One map's online softmax over a tile of scores `s` (unscaled) and its product with V; `total` is the
    # row sums l. The running maximum `m` moves only when some row's grows by more than 8 (in log2 units;
    # FlashAttention-4's conditional rescaling): until then P = exp2(s - m) stays below 2^8, well inside
    # float32 and bf16, and O and l share the stale maximum, so O / l and m + log2 l are what they would
    # be. With the rescale under a branch, P V's accumulator is read only by the next P V: Triton leaves
    # the product in flight (no wait after it), and the other map's softmax runs under it.
    s = s * qk_scale
    if MASKED:
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m, tl.reduce(s, 1, _MAX))
    if tl.reduce(m_new - m, 0, _MAX) > 8.0:
        alpha = tl.exp2(m - m_new)
        acc = acc * alpha[:, None]
        total = total * alpha
        m = m_new
    p = tl.exp2(s - m[:, None])
    total = total + tl.reduce(p, 1, _SUM)
    acc = tl.dot(p.to(k_base.dtype.element_ty).to(DOT), v_tile, acc, input_precision=PRECISION)
    return acc, total, m


def _program(heads, LONGEST_FIRST: tl.constexpr):
    # The block, the (batch, head) pair, the batch row and the head a program takes (grid: blocks x batch
    # * heads). LONGEST_FIRST, causal: the last query blocks see the most keys; the GPU starts blocks in
    # order of their index, so index 0 takes the last block: the longest first, the short ones fill the
    # last wave.
    block = tl.program_id(0)
    if LONGEST_FIRST:
        block = tl.num_programs(0) - 1 - block
    pid_bh = tl.program_id(1)
    return block, pid_bh, pid_bh // heads, pid_bh % heads


def _query_block(
    Q, heads, reps, n_ctx, width, sqb, sqm, sqh, sqn, sqd,
    MAPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    # The query block of a program of the forward or the dQ kernel (the longest first) and its tiles of Q1
    # and Q2: (the (batch, head) pair, batch row, head, kv group, first row, rows, rows inside the
    # sequence, Q's offsets and mask, Q1, Q2).
    pid_m, pid_bh, b, head = _program(heads, True)
    first = pid_m * BLOCK_M
    offs_m = first + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < n_ctx
    q_off = b * sqb + head * sqh + offs_m[:, None] * sqn + offs_d[None, :] * sqd
    q_mask = row_ok[:, None] & (offs_d[None, :] < width)
    q1 = tl.load(Q + q_off, mask=q_mask, other=0.0).to(DOT)
    q2 = q1
    if MAPS == 2:
        q2 = tl.load(Q + q_off + sqm, mask=q_mask, other=0.0).to(DOT)
    return pid_bh, b, head, head // reps, first, offs_m, row_ok, q_off, q_mask, q1, q2


def _key_tile(
    k_base, v_base, start_n, offs_m, skm, skn, skd, svn, sve, n_ctx, width, v_width,
    MAPS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
    DOT: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    # A key tile of the forward or the dQ kernel from row `start_n`: K1, K2 (BLOCK_N, BLOCK_D), V (BLOCK_N,
    # BLOCK_E), and which (query, key) entries the query block sees. MASKED: a tile the diagonal or the
    # sequence's end crosses; otherwise every entry is visible.
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
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
        visible = 0  # every entry is seen
    k1 = tl.load(k_ptrs, mask=k_mask, other=0.0).to(DOT)
    k2 = k1
    if MAPS == 2:
        k2 = tl.load(k_ptrs + skm, mask=k_mask, other=0.0).to(DOT)
    v_tile = tl.load(v_ptrs, mask=v_mask, other=0.0).to(DOT)
    return k1, k2, v_tile, visible


def _fwd_tiles(
    acc1, l1, m1, acc2, l2, m2, q1, q2, k_base, v_base, lo, hi, offs_m,
    skm, skn, skd, svn, sve, n_ctx, width, v_width, qk_scale,
    MAPS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
    PRECISION: tl.constexpr, DOT: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    # The forward's key tiles from `lo` to `hi`: the online softmax of both maps against each K/V tile.
    # MASKED: tiles the diagonal (or the sequence's end) crosses; otherwise every entry is visible.
    for start_n in range(lo, hi, BLOCK_N):
        k1, k2, v_tile, visible = _key_tile(
            k_base, v_base, start_n, offs_m, skm, skn, skd, svn, sve, n_ctx, width, v_width,
            MAPS, BLOCK_N, BLOCK_D, BLOCK_E, DOT, MASKED,
        )  # fmt: skip
        s1 = tl.dot(q1, tl.trans(k1), input_precision=PRECISION)
        s2 = s1
        if MAPS == 2:  # map 2's product before map 1's softmax, so that map 2's softmax runs under P1 V
            s2 = tl.dot(q2, tl.trans(k2), input_precision=PRECISION)
        acc1, l1, m1 = _softmax_pv(
            acc1, l1, m1, s1, v_tile, visible, k_base, qk_scale, PRECISION, DOT, MASKED
        )  # fmt: skip
        if MAPS == 2:
            acc2, l2, m2 = _softmax_pv(
                acc2, l2, m2, s2, v_tile, visible, k_base, qk_scale, PRECISION, DOT, MASKED
            )  # fmt: skip
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
    pid_bh, b, head, group, first, offs_m, row_ok, _, _, q1, q2 = _query_block(
        Q, heads, reps, n_ctx, width, sqb, sqm, sqh, sqn, sqd, MAPS, BLOCK_M, BLOCK_D, DOT
    )  # fmt: skip
    qk_scale = scale * LOG2E  # scores in base 2: exp2 is the cheap one
    offs_e = tl.arange(0, BLOCK_E)
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
