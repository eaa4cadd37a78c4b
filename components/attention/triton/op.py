"""The `triton` backend: `components.attention.triton.kernels` as torch custom ops.

Registered through `torch.library.custom_op` with fake (meta) implementations and `register_autograd`,
so torch.compile traces the forward and the backward as one opaque node each instead of breaking the
graph, and Lightning's loop sees an ordinary differentiable call. Triton is an optional dependency
(`pip install 'ablate[triton]'`): it is imported on the first call, and a missing package is one line.
CPU tensors run through Triton's interpreter (slow, exact: how the kernels are tested without a GPU),
CUDA tensors through the compiled kernels. Each kernel launches with its own configuration (tiles, warps,
stages), timed on the GPU and remembered by `components.attention.triton.configs`, the interpreter's fixed
one on CPU, or the tiles a caller passes (`block`: tests and benchmarks).

Ops (q (B, M, h, N, d) with M = 2 maps for differential attention or 1 for softmax attention,
k (B, M, h_kv, N, d), v (B, h_kv, N, e), lam a float32 0-dim tensor):
- `ablate::triton_attention(q, k, v, lam, block_m, block_n, deterministic=False, norm_weight=None,
  norm_eps=0, norm_factor=1) -> (out, o2, lse, pre, inv)`: out (B, h, N, e) laid out (B, N, h, e),
  O2 = A2 V alike (M = 2; empty for M = 1), lse (B, M, h, N) float32. `deterministic` (or
  `torch.use_deterministic_algorithms(True)` when the forward runs, which `train.deterministic` sets)
  picks the backward without atomics. With `norm_weight` (2d,) the kernel applies Eq. 3's per-head
  RMSNorm times `norm_factor` (1 - λ_init) to out, and keeps `pre` (the output before it, out's layout)
  and `inv` (its inverse RMS, (B, h, N) float32) for the backward; both are empty without it.
- `ablate::triton_attention_backward(dout, q, k, v, lam, out, o2, lse, block_m, block_n, deterministic,
  inv, norm_weight, norm_factor) -> (dq, dk, dv, dlam, dweight)`: δ (after the norm's backward, when
  there is one), then the single pass (dQ by float32 atomics; V up to 128 wide) or the two kernels; dλ = -Σ δ2 and the
  norm weight's gradient summed here.
"""

from __future__ import annotations

import functools
import importlib.util
import math

import torch

from ablate.core.errors import UserError
from components.attention.triton import configs

TRITON_MISSING = "attention_backend: triton needs the triton package (pip install 'ablate[triton]')"
MAX_WIDTH = 256  # V's width (2d for differential attention): two float32 accumulators that wide per block
BLOCK = 64  # the δ kernel's rows per program (tests pass tiles of their own to cross tiles at small sizes)
# V wider than this takes the two-kernel backward: beside dK1, dK2 and dV (4d float32 per key row) the
# single pass's dQ1 and dQ2 products spill on sm_90 in every tile tried (benchmarks/NOTES.md, "read by its
# compiler"); the dK/dV kernel without them does not.
SINGLE_PASS_V = 128


def tma_loads(*tensors: torch.Tensor) -> bool:
    """Whether the kernels load these tensors' tiles by tensor descriptors (TMA on Hopper; the
    interpreter reads them as such too): each one's last dimension contiguous, its start and its other
    strides 16-byte aligned, which the copy engine requires. Otherwise pointer loads."""
    return all(
        t.stride(-1) == 1
        and t.data_ptr() % 16 == 0
        and all(s * t.element_size() % 16 == 0 for s in t.stride()[:-1])
        for t in tensors
    )


def _tma(device: torch.device, *tensors: torch.Tensor) -> bool:
    """`tma_loads` where the device has a copy engine (sm_90 or later) or is the interpreter's CPU."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (9, 0):
        return False
    if not tma_loads(*tensors):
        return False
    if device.type == "cuda":
        _scratch()
    return True


def _scratch() -> None:
    """Device-side tensor descriptors live in global scratch memory that Triton asks the caller for. Set
    at every launch: Triton keeps the allocator per thread (a context variable), and autograd runs the
    backward on a thread of its own."""
    import triton

    triton.set_allocator(_scratch_memory)


def _scratch_memory(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")  # torch's allocations are 512-byte aligned


# The kernels whose tiles may come by tensor descriptors, for 16-bit inputs with V up to TMA_V wide (the
# configurations compiled with both loads: benchmarks/NOTES.md, "a 128-row query tile in the single pass,
# TMA loads"). Not the dK/dV kernel (the single pass too): its 16-row query tiles, three descriptors per
# query head, cost registers for nothing they save (16 x 128 with 8 warps: 253 against the pointer loads'
# 237) and spill at 16 x 64 with 4 warps; not V 256 either, whose forward at 32 x 64 with 8 warps spills
# with them (472 bytes) and not without.
TMA_KERNELS = ("forward", "backward_q")
TMA_V = 128


def tma_kernel(kernel: str, v_width: int, dtype: torch.dtype) -> bool:
    """Whether `kernel` loads its tiles by tensor descriptors (where `tma_loads` allows) for V this wide."""
    return kernel in TMA_KERNELS and v_width <= TMA_V and dtype != torch.float32


def single_pass(v_width: int) -> bool:
    """Whether the backward for V `v_width` wide may be the single pass (unless deterministic)."""
    return v_width <= SINGLE_PASS_V


@functools.cache
def available() -> bool:
    """Whether the triton package is installed (found, not imported: importing it costs a second)."""
    return importlib.util.find_spec("triton") is not None


def require() -> None:
    if not available():
        raise UserError(TRITON_MISSING)


def diff_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor,
    *,
    block: int | None = None,
    deterministic: bool = False,
    norm: tuple[torch.Tensor, float, float] | None = None,
) -> torch.Tensor:
    """Eq. 1, causal: q (B,2,h,N,d) = [Q1, Q2], k (B,2,h_kv,N,d) = [K1, K2], v (B,h_kv,N,2d), lam 0-dim
    -> (B,h,N,2d), laid out (B,N,h,2d). `deterministic`: the backward without atomics. `norm` = (weight
    (2d,), eps, factor): Eq. 3's per-head RMSNorm times `factor` (1 - λ_init) applied by the kernel, as
    `components.norm.rms_norm(out, weight, eps, factor)` would."""
    return _call(q, k, v, lam.float().reshape(()), block, deterministic, norm)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    block: int | None = None,
    deterministic: bool = False,
) -> torch.Tensor:
    """Causal softmax attention by the same kernel with one map: q (B,H,N,d), k and v (B,H_kv,N,d)."""
    lam = torch.zeros((), dtype=torch.float32, device=q.device)
    return _call(q.unsqueeze(1), k.unsqueeze(1), v, lam, block, deterministic)


def _call(q, k, v, lam, block, deterministic, norm=None):
    require()
    if v.shape[-1] > MAX_WIDTH:
        raise UserError(
            f"attention_backend: triton takes V up to {MAX_WIDTH} wide (sub-heads up to "
            f"{MAX_WIDTH // 2} for diff), got {v.shape[-1]}; allowed there: auto, sdpa, math"
        )
    if q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise UserError(f"attention_backend: triton takes float32, bfloat16 or float16, not {q.dtype}")
    if q.device.type not in ("cpu", "cuda"):
        raise UserError(f"attention_backend: triton runs on cuda (cpu: interpreted), not {q.device.type}")
    with torch.autocast(q.device.type, enabled=False):  # dtypes are chosen here, not by autocast
        k, v = k.to(q.dtype), v.to(q.dtype)
        block_m, block_n = (block, block) if block else (0, 0)  # 0: each kernel's own (`_launch`)
        weight, eps, factor = norm if norm is not None else (None, 0.0, 1.0)
        return torch.ops.ablate.triton_attention(
            q, k, v, lam, block_m, block_n, deterministic, weight, float(eps), float(factor)
        )[0]


def _launch(
    kernel: str, q: torch.Tensor, width: int, v_width: int, block_m: int, block_n: int, launch, tma: bool,
    atomic=False,
) -> None:  # fmt: skip
    """Run `launch(block_m, block_n, options)` once with `kernel`'s configuration: the tiles given
    (block_m > 0: tests and benchmarks, every kernel alike), the interpreter's fixed one on CPU, or on
    CUDA the one `configs` chose for the kernel, shape, dtype and GPU (timed with `launch` itself
    the first time). `tma`: tiles loaded by tensor descriptors (`_tma`) where `tma_kernel` says."""
    tma = tma and tma_kernel(kernel, v_width, q.dtype)
    if block_m:
        rows = block_n if kernel == "backward_kv" else block_m  # the rows of most of its products
        launch(block_m, block_n, _warps(q, rows) | _launch_options(q, width, v_width, block_m, block_n, tma))
        return
    if q.device.type != "cuda":
        config = configs.INTERPRETED
        options = _launch_options(q, width, v_width, config.block_m, config.block_n, tma)
        launch(config.block_m, config.block_n, options)
        return
    capability = torch.cuda.get_device_capability(q.device)
    key = configs.Key(kernel, q.shape[1], width, v_width, q.dtype, q.shape[3], capability, atomic)

    def run(config) -> None:
        options = _launch_options(q, width, v_width, config.block_m, config.block_n, tma)
        launch(
            config.block_m,
            config.block_n,
            options | {"num_warps": config.num_warps, "num_stages": config.num_stages},
        )

    run(configs.chooser().choose(key, run))


def _pow2(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())  # tl.dot multiplies blocks at least 16 wide


def _launch_options(
    q: torch.Tensor, width: int, v_width: int, block_m: int, block_n: int, tma: bool = False
) -> dict:
    import triton.language as tl

    interpret = q.device.type == "cpu"
    dtype = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[q.dtype]
    options = {
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "BLOCK_D": _pow2(width),
        "BLOCK_E": _pow2(v_width),
        "PRECISION": "ieee" if q.dtype == torch.float32 else "tf32",  # float32 stays float32 (no TF32)
        "DOT": tl.float32 if interpret and dtype == tl.bfloat16 else dtype,  # kernels.py: `DOT`
        "TMA": tma,
    }
    return options


def _warps(q: torch.Tensor, rows: int) -> dict:
    """The launch options of tiles a caller passes (the interpreter takes none)."""
    return {} if q.device.type == "cpu" else {"num_warps": configs.warps(rows), "num_stages": 2}


def _kernels(device: torch.device):
    require()
    from components.attention.triton import kernels

    return kernels.kernels(device.type == "cpu")


def _outputs(q: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, maps, heads, n, _ = q.shape
    e = v.shape[-1]
    out = q.new_empty(batch, n, heads, e).transpose(1, 2)  # merging heads for out_proj is a view
    o2 = q.new_empty(batch, n, heads, e).transpose(1, 2) if maps == 2 else q.new_empty(0)
    lse = torch.empty(batch, maps, heads, n, dtype=torch.float32, device=q.device)
    return out, o2, lse


def _normed(q: torch.Tensor, v: torch.Tensor, norm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The output before the norm (out's layout) and the inverse RMS per row (B, h, N) float32; empty
    without the norm."""
    batch, _, heads, n, _ = q.shape
    if not norm:
        return q.new_empty(0), torch.empty(0, dtype=torch.float32, device=q.device)
    pre = q.new_empty(batch, n, heads, v.shape[-1]).transpose(1, 2)
    return pre, torch.empty(batch, heads, n, dtype=torch.float32, device=q.device)


@torch.library.custom_op("ablate::triton_attention", mutates_args=())
def _forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor,
    block_m: int,
    block_n: int,
    deterministic: bool = False,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 0.0,
    norm_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, maps, heads, n, width = q.shape
    kv_heads, v_width = k.shape[2], v.shape[-1]
    norm = norm_weight is not None
    out, o2, lse = _outputs(q, v)
    pre, inv = _normed(q, v, norm)
    weight = norm_weight.contiguous() if norm else lam
    fwd = _kernels(q.device)[0]

    def launch(block_m: int, block_n: int, options: dict) -> None:
        fwd[(math.ceil(n / block_m), batch * heads)](
            q, k, v, out, o2 if maps == 2 else out, lse, lam, pre if norm else out, inv if norm else lse,
            weight, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
            heads, heads // kv_heads, n, width, v_width, 1 / math.sqrt(width), norm_eps, norm_factor,
            MAPS=maps, NORM=norm, **options,
        )  # fmt: skip

    _launch("forward", q, width, v_width, block_m, block_n, launch, _tma(q.device, q, k, v))
    return out, o2, lse, pre, inv


@_forward.register_fake
def _forward_fake(
    q, k, v, lam, block_m, block_n, deterministic=False, norm_weight=None, norm_eps=0.0, norm_factor=1.0
):
    return (*_outputs(q, v), *_normed(q, v, norm_weight is not None))


@torch.library.custom_op("ablate::triton_attention_backward", mutates_args=())
def _backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor,
    out: torch.Tensor,
    o2: torch.Tensor,
    lse: torch.Tensor,
    block_m: int,
    block_n: int,
    deterministic: bool = False,
    inv: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`out`: the attention's output (before the norm, when `norm_weight` is given: then `dout` is the
    gradient after it, and `inv` the forward's inverse RMS)."""
    batch, maps, heads, n, width = q.shape
    kv_heads, v_width = k.shape[2], v.shape[-1]
    norm = norm_weight is not None
    dout = dout.to(q.dtype)
    delta = torch.empty(lse.shape, dtype=torch.float32, device=q.device)
    bwd_delta, bwd_kv, bwd_q = _kernels(q.device)[1:]
    rows = block_m or BLOCK  # the δ kernel's query rows per program
    blocks_m = math.ceil(n / rows)
    if norm:  # the norm's backward runs in the δ kernel: dO (out's layout) and the weight's partial sums
        dpre, _ = _normed(q, v, True)
        dw = torch.empty(batch * heads * blocks_m, _pow2(v_width), dtype=torch.float32, device=q.device)
    bwd_delta[(blocks_m, batch * heads)](
        out, o2 if maps == 2 else out, dout, delta, lam,
        inv if norm else lse, norm_weight.contiguous() if norm else lam, dpre if norm else out,
        dw if norm else lse, *out.stride(), *dout.stride(), heads, n, v_width, norm_factor,
        MAPS=maps, NORM=norm, BLOCK_M=rows, BLOCK_E=_pow2(v_width),
    )  # fmt: skip
    if norm:
        dout = dpre
        dweight = (dw.sum(0)[:v_width] * norm_factor).to(norm_weight.dtype)
    else:
        dweight = torch.empty(0, dtype=torch.float32, device=q.device)
    dlam = -delta[:, 1].sum() if maps == 2 else torch.zeros_like(lam)
    dk, dv = (torch.empty(t.shape, dtype=q.dtype, device=q.device) for t in (k, v))
    # The single pass adds dQ into float32 by atomics (their order varies: not bitwise reproducible);
    # the deterministic pass writes it from a second kernel per query block, as V wider than 128 does.
    deterministic = deterministic or not single_pass(v_width)
    dq = torch.empty(q.shape, dtype=q.dtype if deterministic else torch.float32, device=q.device)
    inputs = (*q.stride(), *k.stride(), *v.stride(), *dout.stride())
    sizes = (n, width, v_width, 1 / math.sqrt(width))

    def launch_kv(block_m: int, block_n: int, options: dict) -> None:
        if not deterministic:
            dq.zero_()  # the atomics add into it (again on every timed trial)
        bwd_kv[(math.ceil(n / block_n), batch * kv_heads)](
            q, k, v, dout, lse, delta, lam, dk, dv, dq, *inputs, *dk.stride(), *dv.stride(), *dq.stride(),
            heads, kv_heads, heads // kv_heads, *sizes, MAPS=maps, ATOMIC=not deterministic, **options,
        )  # fmt: skip

    def launch_q(block_m: int, block_n: int, options: dict) -> None:
        bwd_q[(math.ceil(n / block_m), batch * heads)](
            q, k, v, dout, lse, delta, lam, dq, *inputs, *dq.stride(), heads, heads // kv_heads, *sizes,
            MAPS=maps, **options,
        )  # fmt: skip

    tma = _tma(q.device, q, k, v, dout)
    _launch("backward_kv", q, width, v_width, block_m, block_n, launch_kv, tma, atomic=not deterministic)
    if deterministic:
        _launch("backward_q", q, width, v_width, block_m, block_n, launch_q, tma)
    else:
        dq = dq.to(q.dtype)
    return dq, dk, dv, dlam.reshape(lam.shape), dweight


@_backward.register_fake
def _backward_fake(
    dout,
    q,
    k,
    v,
    lam,
    out,
    o2,
    lse,
    block_m,
    block_n,
    deterministic=False,
    inv=None,
    norm_weight=None,
    norm_factor=1.0,
):
    dweight = norm_weight.new_empty(norm_weight.shape) if norm_weight is not None else lam.new_empty(0)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), torch.empty_like(lam), dweight


def _setup_context(ctx, inputs, output):
    q, k, v, lam, block_m, block_n, deterministic, norm_weight, _, norm_factor = inputs
    out, o2, lse, pre, inv = output
    norm = norm_weight is not None
    ctx.save_for_backward(q, k, v, lam, pre if norm else out, o2, lse, inv, norm_weight)
    ctx.options = (block_m, block_n, deterministic or torch.are_deterministic_algorithms_enabled())
    ctx.norm_factor = norm_factor
    ctx.mark_non_differentiable(o2, lse, pre, inv)


def _grad(ctx, dout, do2, dlse, dpre, dinv):
    q, k, v, lam, out, o2, lse, inv, norm_weight = ctx.saved_tensors
    norm = norm_weight is not None
    dq, dk, dv, dlam, dweight = torch.ops.ablate.triton_attention_backward(
        dout, q, k, v, lam, out, o2, lse, *ctx.options, inv if norm else None, norm_weight, ctx.norm_factor
    )
    return dq, dk, dv, dlam, None, None, None, dweight if norm else None, None, None


_forward.register_autograd(_grad, setup_context=_setup_context)
