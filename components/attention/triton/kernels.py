"""Differential attention as one FlashAttention-style Triton kernel per direction (`triton` backend).

Why our own: a fused kernel for ordinary attention computes Eq. 1 only by being called twice (split V or
FlashDiffAttn's decomposition, Appendix A): two passes over K and V and two outputs written and combined.
Here each query block walks its K/V tiles once, keeps the online-softmax statistics of both maps, meets
the shared V tile with both maps, and writes (A1 - λ A2) V once. With one map (`MAPS = 1`) it is plain
causal softmax attention, so the Transformer arm can be timed on the same code.

- forward (`_fwd`): per (query block, batch, head; the longest causal blocks first): O = O1 - λ O2 with
  O_m = A_m V, O2 (for the backward), and each map's log-sum-exp of the scaled scores (natural log,
  float32). Both maps' score products are issued before either softmax, and each map's running maximum
  is rescaled only when it grows by more than 2^8 (`_softmax_pv`), so P V stays in flight on the GPU
  while the other map's exponentials run.
- backward: with δ1 = rowsum(dO · O1) = rowsum(dO · O) + λ δ2 and δ2 = rowsum(dO · O2) (`_bwd_delta`;
  the caller sums dλ = -Σ δ2), both maps are recomputed per tile from the log-sum-exp: P_m = exp(S_m - lse_m),
  dP = dO V^T (shared), dS1 = P1 (dP - δ1), dS2 = -λ P2 (dP - δ2), dV = (P1 - λ P2)^T dO.
  `_bwd_kv` walks transposed tiles (S^T = K Q^T, as Triton's fused-attention tutorial), so dV and dK
  read P^T and dS^T from registers. Single pass (FlashAttention-2's structure, `_bwd_kv` with ATOMIC; V up to
  128 wide, wider takes the deterministic path): per key block and kv head, looping
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
- loads (`TMA`): the forward's and the dQ kernel's tiles of Q, K, V and dO by tensor descriptors, one per
  head's rows (`forward._rows`, `_tile`: on Hopper the copy engine fetches a tile and fills what lies
  past the sequence or the width with zeros), where the op found every such tensor's last dimension
  contiguous and its start and other strides 16-byte aligned (`op.tma_loads`), in 16 bits with V up
  to 128 wide; otherwise, and always in the dK/dV kernel (`op.tma_kernel`), by pointers with masks.

Layouts (any strides): q (B, M, h, N, d) = the maps' queries stacked on dim 1, k (B, M, h_kv, N, d),
v (B, h_kv, N, e); query head i reads kv head i // (h / h_kv). Widths are padded to powers of two (16 at
least, `tl.dot`'s minimum) and masked, as are sequence tails. Products accumulate in float32; float32
inputs multiply in IEEE float32 (no TF32). `DOT` is the type the products' operands are cast to: the
inputs' own (a no-op) on the GPU; float32 for bf16 under the interpreter, whose `tl.dot` multiplies bf16
as raw 16-bit integers (a bf16 product is exact in float32, and the maps are rounded to bf16 first, so the
arithmetic is the GPU's, but for one difference: the interpreter casts float32 to bf16 by truncation
where the GPU rounds to nearest, a step of 2^-8 on about half of the rounded values).

The kernels are plain Python functions, the forward's in `forward.py` and the backward's in
`backward.py`: `kernels(interpret)` here wraps them with `triton.jit` for CUDA tensors or
Triton's interpreter for CPU tensors. `TRITON_INTERPRET=1` would decide that once, when triton is first
imported (Lightning imports it early), so the kernels call only Triton's built-ins, which the interpreter
patches per launch, and their own tile loops, wrapped the same way as the kernel in a namespace per kind
(`_rebind`): one process runs both kinds, whatever imported triton first.
"""

from __future__ import annotations

import functools
import types

import triton

from components.attention.triton import backward, forward

_TILES = (  # the jit functions the kernels call, wrapped the same way as the kernels
    *(forward._program, forward._rows, forward._map_rows, forward._tile, forward._store_rows),
    forward._kv_sources,
    *(forward._query_block, forward._key_tile, forward._fwd_tiles, forward._softmax_pv),
    *(backward._bwd_kv_map, backward._bwd_kv_tiles, backward._bwd_q_tiles),
)
_KERNELS = (forward._fwd, backward._bwd_delta, backward._bwd_kv, backward._bwd_q)
_COMBINE = ("_MAX", "_SUM")  # Triton's own jit functions the kernels reduce with


@functools.cache
def kernels(interpret: bool):
    """(forward, backward δ, backward kv, backward q) for CPU tensors through Triton's interpreter
    (`interpret`) or compiled for the GPU.

    A kernel calls its tile loops by their global names, which must be wrapped the same way as the
    kernel (the compiler calls only jit functions, the interpreter only interpreted ones), and one
    process may run both kinds: each kind gets copies of the functions whose globals name its own. The
    compiled kind is made with `JITFunction` itself, not `triton.jit`, which under TRITON_INTERPRET=1 makes
    interpreted functions, as that setting made Triton's own combining functions (`_MAX`, `_SUM`): those
    are compiled from their source then. The copies keep their annotations: `tl.constexpr` is how a
    launch knows which arguments it compiles in (without them a GPU launch cannot specialise the tiles)."""
    from triton.runtime.interpreter import InterpretedFunction

    wrap = InterpretedFunction if interpret else triton.runtime.JITFunction  # not triton.jit: see below
    namespace = {**vars(forward), **vars(backward)}  # their constants, `tl` and one another
    if not interpret:  # the reductions' combining functions, compiled whatever TRITON_INTERPRET said
        for name in _COMBINE:
            if not isinstance(namespace[name], triton.runtime.JITFunction):
                namespace[name] = wrap(namespace[name].fn)
    for f in _TILES:
        namespace[f.__name__] = wrap(_rebind(f, namespace))
    return tuple(wrap(_rebind(f, namespace)) for f in _KERNELS)


def _rebind(f: types.FunctionType, namespace: dict) -> types.FunctionType:
    """`f` reading its globals from `namespace` (same code, so Triton reads the same source)."""
    copy = types.FunctionType(f.__code__, namespace, f.__name__, f.__defaults__, f.__closure__)
    copy.__module__, copy.__qualname__, copy.__doc__ = f.__module__, f.__qualname__, f.__doc__
    copy.__annotations__ = f.__annotations__  # `tl.constexpr`: which arguments a launch compiles in
    return copy
