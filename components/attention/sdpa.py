"""The attention cores built on PyTorch (`components.attention.backends` names them in its `TABLE`):
SDPA whole or held to one fused kernel, flash-attn, differential attention on them in the split-V and
padded forms of Appendix A, and the cores of `blockwise.py` and `combined.py` called from the backends'
layout.

`flash_attn` is flash-attn's `flash_attn_func` (CUDA, fp16/bf16), probed once at import (`FLASH_ATTN`) and
reached only through `flash_attn_func()`, the one seam a CPU stand-in replaces in tests. The SDPA backends
held to one fused kernel (`sdpa_flash`, `sdpa_efficient`, `sdpa_cudnn`) are held by
`torch.nn.attention.sdpa_kernel` (`restrict_sdpa`), so the kernel that runs is the one recorded, never a
silent fall-back to the math kernel; on CPU only `sdpa_flash` has a kernel (PyTorch's fused CPU kernel).

Tensors as in `backends`: (batch, heads, seq, width), kv heads dividing query heads; differential
attention takes the maps' queries and keys stacked on dim 1.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ablate.core.errors import UserError
from components.attention import blockwise, combined

# The fused SDPA kernel each restricted backend is held to (torch.nn.attention.SDPBackend names).
SDPA_KERNELS = {
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
}
FLASH_MISSING = (
    "flash_attn backend: the flash-attn package is not installed (pip install 'ablate[flash]', CUDA only)"
)
_SDPA_HAS_GQA = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)


def _probe_flash_attn():
    """flash-attn's `flash_attn_func`, or None where the package does not import (it is optional). Probed
    once, when this module is imported: an import tried on every attention call is, under torch.compile, a
    graph break per layer (a failed import cannot be traced)."""
    try:
        from flash_attn import flash_attn_func as fn
    except ImportError:
        return None
    return fn


FLASH_ATTN = _probe_flash_attn()


def flash_attn_func():
    """The seam to flash-attn: its `flash_attn_func` as probed at import (tests replace `FLASH_ATTN`)."""
    if FLASH_ATTN is None:
        raise UserError(FLASH_MISSING)
    return FLASH_ATTN


# --- softmax attention -----------------------------------------------------------------------------


def sdpa_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """PyTorch's fused `scaled_dot_product_attention`, causal, whichever kernel it picks."""
    return _sdpa(q, k, v)


def held(name: str) -> Callable[..., torch.Tensor]:
    """The core of `name` (a key of `SDPA_KERNELS`): SDPA held to that kernel alone."""
    return functools.partial(_sdpa_held, name)


def flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # flash-attn's layout is (batch, seq, heads, width); it handles fewer kv heads natively.
    fn = flash_attn_func()
    out = fn(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        dropout_p=0.0,
        softmax_scale=None,
        causal=True,
    )
    return out.transpose(1, 2)


def blockwise_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, fused: bool) -> torch.Tensor:
    """`blockwise.attention` for softmax attention; `fused`: SDPA's fused forward where it serves."""
    groups = k.shape[1]
    qg = q.unflatten(1, (groups, -1)).unsqueeze(1)  # (B,1,G,R,N,d)
    forward = _sdpa_grouped if fused and _on_sdpa(q) else None
    return blockwise.attention(qg, k.unsqueeze(1), v, fused_forward=forward).flatten(1, 2)


# --- differential attention ------------------------------------------------------------------------


def split_v(core: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Differential attention on a fused softmax `core` (q, k, v) -> out, FlashDiffAttn_2 (Appendix A): the
    fused kernels need V as wide as Q/K (a wide V silently drops SDPA to its math kernel), so V is split
    into halves. Stacking Q1|Q2 and K1|K2 as heads keeps the pairing (stacked query head j reads stacked
    kv head j // (h / h_kv)) and gives one call per half."""

    def diff(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        h, neg_lam = q.shape[2], -lam
        qs, ks = q.flatten(1, 2), k.flatten(1, 2)  # (B,2h,N,d), (B,2h_kv,N,d)
        halves = []
        for v_half in v.chunk(2, dim=-1):
            both = core(qs, ks, torch.cat([v_half, v_half], dim=1))  # [A1 V_half; A2 V_half] as heads
            halves.append(torch.addcmul(both[:, :h], both[:, h:], neg_lam).transpose(1, 2))  # (B,N,h,d)
        return torch.cat(halves, dim=-1).transpose(1, 2)  # [A1 V1 - λ A2 V1, A1 V2 - λ A2 V2]

    return diff


def padded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """FlashDiffAttn_1 (Appendix A) on a kernel that needs equal widths: Q and K zero-padded to V's width
    2d leave every score unchanged (the scale is given explicitly), so one fused call computes
    [A1 V; A2 V] for the stacked heads, one softmax per map (split V needs two per map)."""
    h, d = q.shape[2], q.shape[-1]
    qp, kp = (F.pad(t.permute(0, 3, 1, 2, 4), (0, d)).permute(0, 2, 3, 1, 4).flatten(1, 2) for t in (q, k))
    both = _sdpa(
        qp, kp, torch.cat([v, v], dim=1), scale=1 / math.sqrt(d)
    )  # (B,2h,N,2d), laid out (B,N,2h,2d)
    return torch.addcmul(both[:, :h], both[:, h:], -lam)


def blockwise_diff(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lam: torch.Tensor, *, fused: bool
) -> torch.Tensor:
    """`blockwise.attention` for differential attention; `fused`: the padded forward where SDPA serves."""
    qg = q.unflatten(2, (k.shape[2], -1))  # (B,2,G,R,N,d)
    forward = _padded_grouped if fused and _on_sdpa(q) else None
    return blockwise.attention(qg, k, v, lam, fused_forward=forward).flatten(1, 2)


def combined_diff(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    return combined.attention(q.unflatten(2, (k.shape[2], -1)), k, v, lam).flatten(1, 2)


# --- the pieces ------------------------------------------------------------------------------------


def _on_sdpa(q: torch.Tensor) -> bool:
    """Whether SDPA's fused kernels serve these tensors (CPU, CUDA) for the blockwise forward."""
    return q.device.type in ("cpu", "cuda") and q.dtype in (torch.float32, torch.bfloat16, torch.float16)


def _sdpa_grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """The blockwise backend's forward for softmax attention: q (B,1,G,R,N,d) -> (B,G,R,N,d)."""
    return _sdpa(q[:, 0].flatten(1, 2), k[:, 0], v).unflatten(1, (k.shape[2], -1))


def _padded_grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """The blockwise backend's forward for differential attention: q (B,2,G,R,N,d) -> (B,G,R,N,2d)."""
    return padded(q.flatten(2, 3), k, v, lam).unflatten(1, (k.shape[2], -1))


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    if q.shape[1] == k.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    if _SDPA_HAS_GQA:  # the fused kernels read kv head i // (H / H_kv) themselves: no copies
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, scale=scale)
    repeat = q.shape[1] // k.shape[1]  # torch < 2.5: no enable_gqa
    k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)


def restrict_sdpa(name: str):
    """The seam to SDPA's kernel choice: a context in which SDPA may run only `name`'s kernel (tests replace
    it to drive the CUDA kernels' calls on CPU, where only the flash kernel exists)."""
    return sdpa_kernel([getattr(SDPBackend, SDPA_KERNELS[name])])


def _sdpa_held(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA held to `name`'s kernel. The memory-efficient and cuDNN kernels take no grouped kv heads
    (`enable_gqa` is the flash and math kernels' only), so their kv heads are repeated per group."""
    if name != "sdpa_flash" and q.shape[1] != k.shape[1]:
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    try:
        with restrict_sdpa(name):
            return _sdpa(q, k, v)
    except RuntimeError as e:
        if "No viable backend" not in str(e) and "No available kernel" not in str(e):
            raise
        raise UserError(
            f"backend: {name} has no kernel for {q.device.type} {str(q.dtype).removeprefix('torch.')} "
            f"heads {q.shape[-1]} wide; allowed there: auto, sdpa, math"
        ) from None
