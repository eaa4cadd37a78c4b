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


def _rows(base, n_ctx, width, stride, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, TMA: tl.constexpr):
    # Where the tiles of one head's n_ctx x width rows, starting at `base` and `stride` apart, are loaded
    # from: with TMA a tensor descriptor over them (the copy engine fetches a tile and fills what lies past
    # the rows or the width with zeros; the op checked the strides), else the pointer itself.
    src = base
    if TMA:
        src = tl.make_tensor_descriptor(base, [n_ctx, width], [stride, 1], [BLOCK_R, BLOCK_C])
    return src


def _tile(
    src, start, n_ctx, width, stride, col_stride,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, TMA: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    # Rows `start` to `start + BLOCK_R` of a source `_rows` made, (BLOCK_R, BLOCK_C) in the inputs' type,
    # zeros past the width and, MASKED (the pointer loads check the rows only there), past the rows.
    if TMA:
        tile = src.load([start, 0])
    else:
        offs_r = start + tl.arange(0, BLOCK_R)
        offs_c = tl.arange(0, BLOCK_C)
        mask = offs_c[None, :] < width
        if MASKED:
            mask = (offs_r[:, None] < n_ctx) & mask
        tile = tl.load(src + offs_r[:, None] * stride + offs_c[None, :] * col_stride, mask=mask, other=0.0)
    return tile


def _store_rows(
    base, tile, start, n_ctx, width, stride, col_stride, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr
):
    # `tile` (BLOCK_R, BLOCK_C) into rows `start` on of one head's n_ctx x width rows at `base`, in its type.
    offs_r = start + tl.arange(0, BLOCK_R)
    offs_c = tl.arange(0, BLOCK_C)
    mask = (offs_r[:, None] < n_ctx) & (offs_c[None, :] < width)
    ptrs = base + offs_r[:, None] * stride + offs_c[None, :] * col_stride
    tl.store(ptrs, tile.to(base.dtype.element_ty), mask=mask)


def _map_rows(
    base, map_stride, n_ctx, width, stride,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, MAPS: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    # The sources (`_rows`) of both maps' tiles, Q1 and Q2 or K1 and K2, map 2's rows `map_stride` after
    # map 1's (one map: map 1's twice).
    src1 = _rows(base, n_ctx, width, stride, BLOCK_R, BLOCK_C, TMA)
    src2 = src1
    if MAPS == 2:
        src2 = _rows(base + map_stride, n_ctx, width, stride, BLOCK_R, BLOCK_C, TMA)
    return src1, src2


def _kv_sources(
    K, V, b, group, n_ctx, width, v_width, skb, skm, skh, skn, svb, svh, svn,
    MAPS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
    TMA: tl.constexpr,
):  # fmt: skip
    # The sources (`_rows`) of K1, K2 and V tiles of `BLOCK_N` rows for batch row `b` and kv head `group`.
    k1, k2 = _map_rows(K + b * skb + group * skh, skm, n_ctx, width, skn, BLOCK_N, BLOCK_D, MAPS, TMA)
    v = _rows(V + b * svb + group * svh, n_ctx, v_width, svn, BLOCK_N, BLOCK_E, TMA)
    return k1, k2, v


def _query_block(
    Q, heads, reps, n_ctx, width, sqb, sqm, sqh, sqn, sqd,
    MAPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, DOT: tl.constexpr,
    TMA: tl.constexpr,
):  # fmt: skip
    # The query block of a program of the forward or the dQ kernel (the longest first) and its tiles of Q1
    # and Q2: (the (batch, head) pair, batch row, head, kv group, first row, rows, rows inside the
    # sequence, Q1, Q2).
    pid_m, pid_bh, b, head = _program(heads, True)
    first = pid_m * BLOCK_M
    offs_m = first + tl.arange(0, BLOCK_M)
    q1, q2 = _map_rows(Q + b * sqb + head * sqh, sqm, n_ctx, width, sqn, BLOCK_M, BLOCK_D, MAPS, TMA)
    q1 = _tile(q1, first, n_ctx, width, sqn, sqd, BLOCK_M, BLOCK_D, TMA, True).to(DOT)
    q2_tile = q1
    if MAPS == 2:
        q2_tile = _tile(q2, first, n_ctx, width, sqn, sqd, BLOCK_M, BLOCK_D, TMA, True).to(DOT)
    return pid_bh, b, head, head // reps, first, offs_m, offs_m < n_ctx, q1, q2_tile


def _key_tile(
    k1_src, k2_src, v_src, start_n, offs_m, skn, skd, svn, sve, n_ctx, width, v_width,
    MAPS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
    DOT: tl.constexpr, MASKED: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    # A key tile of the forward or the dQ kernel from row `start_n`: K1, K2 (BLOCK_N, BLOCK_D), V (BLOCK_N,
    # BLOCK_E), and which (query, key) entries the query block sees. MASKED: a tile the diagonal or the
    # sequence's end crosses; otherwise every entry is visible.
    k1 = _tile(k1_src, start_n, n_ctx, width, skn, skd, BLOCK_N, BLOCK_D, TMA, MASKED).to(DOT)
    k2 = k1
    if MAPS == 2:
        k2 = _tile(k2_src, start_n, n_ctx, width, skn, skd, BLOCK_N, BLOCK_D, TMA, MASKED).to(DOT)
    v_tile = _tile(v_src, start_n, n_ctx, v_width, svn, sve, BLOCK_N, BLOCK_E, TMA, MASKED).to(DOT)
    visible = 0  # every entry is seen
    if MASKED:
        offs_n = start_n + tl.arange(0, BLOCK_N)
        visible = (offs_m[:, None] >= offs_n[None, :]) & (offs_n < n_ctx)[None, :]
    return k1, k2, v_tile, visible


def _fwd_tiles(
    acc1, l1, m1, acc2, l2, m2, q1, q2, K, k1_src, k2_src, v_src, lo, hi, offs_m,
    skn, skd, svn, sve, n_ctx, width, v_width, qk_scale,
    MAPS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
    PRECISION: tl.constexpr, DOT: tl.constexpr, MASKED: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    # The forward's key tiles from `lo` to `hi`: the online softmax of both maps against each K/V tile.
    # MASKED: tiles the diagonal (or the sequence's end) crosses; otherwise every entry is visible.
    for start_n in range(lo, hi, BLOCK_N):
        k1, k2, v_tile, visible = _key_tile(
            k1_src, k2_src, v_src, start_n, offs_m, skn, skd, svn, sve, n_ctx, width, v_width,
            MAPS, BLOCK_N, BLOCK_D, BLOCK_E, DOT, MASKED, TMA,
        )  # fmt: skip
        s1 = tl.dot(q1, tl.trans(k1), input_precision=PRECISION)
        s2 = s1
        if MAPS == 2:  # map 2's product before map 1's softmax, so that map 2's softmax runs under P1 V
            s2 = tl.dot(q2, tl.trans(k2), input_precision=PRECISION)
        acc1, l1, m1 = _softmax_pv(
            acc1, l1, m1, s1, v_tile, visible, K, qk_scale, PRECISION, DOT, MASKED
        )  # fmt: skip
        if MAPS == 2:
            acc2, l2, m2 = _softmax_pv(
                acc2, l2, m2, s2, v_tile, visible, K, qk_scale, PRECISION, DOT, MASKED
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
    TMA: tl.constexpr,
):  # fmt: skip
    # TMA: Q, K and V tiles by tensor descriptors (`_rows`), else by pointers.
    pid_bh, b, head, group, first, offs_m, row_ok, q1, q2 = _query_block(
        Q, heads, reps, n_ctx, width, sqb, sqm, sqh, sqn, sqd, MAPS, BLOCK_M, BLOCK_D, DOT, TMA
    )  # fmt: skip
    qk_scale = scale * LOG2E  # scores in base 2: exp2 is the cheap one
    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l1 = tl.full([BLOCK_M], 0.0, tl.float32)
    acc1 = tl.full([BLOCK_M, BLOCK_E], 0.0, tl.float32)
    m2 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l2 = tl.full([BLOCK_M], 0.0, tl.float32)
    acc2 = tl.full([BLOCK_M, BLOCK_E], 0.0, tl.float32)
    k1_src, k2_src, v_src = _kv_sources(
        K, V, b, group, n_ctx, width, v_width, skb, skm, skh, skn, svb, svh, svn,
        MAPS, BLOCK_N, BLOCK_D, BLOCK_E, TMA,
    )  # fmt: skip
    # Causal: key tiles up to the block's last row. Those that end at or before its first row are seen
    # whole by every row (no mask); the rest cross the diagonal (masked, the sequence's end too).
    whole = (first + 1) // BLOCK_N * BLOCK_N
    hi = tl.minimum(first + BLOCK_M, n_ctx)
    acc1, l1, m1, acc2, l2, m2 = _fwd_tiles(
        acc1, l1, m1, acc2, l2, m2, q1, q2, K, k1_src, k2_src, v_src, 0, whole, offs_m,
        skn, skd, svn, sve, n_ctx, width, v_width, qk_scale,
        MAPS, BLOCK_N, BLOCK_D, BLOCK_E, PRECISION, DOT, False, TMA,
    )  # fmt: skip
    acc1, l1, m1, acc2, l2, m2 = _fwd_tiles(
        acc1, l1, m1, acc2, l2, m2, q1, q2, K, k1_src, k2_src, v_src, whole, hi, offs_m,
        skn, skd, svn, sve, n_ctx, width, v_width, qk_scale,
        MAPS, BLOCK_N, BLOCK_D, BLOCK_E, PRECISION, DOT, True, TMA,
    )  # fmt: skip
    out = acc1 / l1[:, None]
    o_base = b * sob + head * soh
    lse_ptrs = LSE + (b * MAPS * heads + head) * n_ctx + offs_m  # LSE (B, MAPS, h, N) contiguous
    tl.store(lse_ptrs, (m1 + tl.log2(l1)) * LN2, mask=row_ok)
    if MAPS == 2:
        lam = tl.load(LAM)
        out2 = acc2 / l2[:, None]
        out = out - lam * out2
        _store_rows(O2 + o_base, out2, first, n_ctx, v_width, son, soe, BLOCK_M, BLOCK_E)
        tl.store(lse_ptrs + heads * n_ctx, (m2 + tl.log2(l2)) * LN2, mask=row_ok)
    if NORM:
        # Eq. 3's per-head RMSNorm times (1 - λ_init) (`factor`) on the head's whole row, from the output
        # rounded to the inputs' type as the unfused norm would read it; the rounded output (PRE, out's
        # layout) and the inverse RMS (INV, (B, h, N) contiguous) are kept for the backward.
        pre = out.to(OUT.dtype.element_ty)
        _store_rows(PRE + o_base, pre, first, n_ctx, v_width, son, soe, BLOCK_M, BLOCK_E)
        x = pre.to(tl.float32)
        inv = tl.math.rsqrt(tl.reduce(x * x, 1, _SUM) / v_width + eps)
        tl.store(INV + pid_bh * n_ctx + offs_m, inv, mask=row_ok)
        offs_e = tl.arange(0, BLOCK_E)
        w = tl.load(W + offs_e, mask=offs_e < v_width, other=0.0).to(tl.float32) * factor
        out = x * inv[:, None] * w[None, :]
    _store_rows(OUT + o_base, out, first, n_ctx, v_width, son, soe, BLOCK_M, BLOCK_E)
