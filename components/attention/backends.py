"""Attention cores shared by the attention kinds, selected by name: `TABLE` (at the end of this module) holds
every backend once, with what it runs on, how it attends for softmax attention and for differential
attention, and what it is; `BACKENDS` is its names, and docs/recipes-and-components.md lists the table's
rows (tests/ablate/test_docs.py keeps the two equal). This module dispatches (`attend`, `diff_attend`),
resolves `auto`, and holds the math form (the reference) and the pieces the attention kinds share; the
cores by family live beside it: PyTorch's (SDPA, flash-attn, the blockwise and combined forms) in
`sdpa.py`, ours in Triton in the `triton/` subpackage.

`auto` names no core of its own: `resolve` turns it into one for the tensors' device, dtype and width (the
rules, each measured, are in its body and in benchmarks/NOTES.md). A module resolves it once per device,
dtype and sequence length (`Resolved`), not on every forward call; the CPU's AMX flag is read from
/proc/cpuinfo once per process, when this module is imported.

Tensors are (batch, heads, seq, width). Keys and values may have fewer heads than queries (grouped-query
attention): query head i reads kv head i // (H / H_kv), the convention of flash-attn and SDPA.
Softmax scale is 1/sqrt(width of q).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ablate.core.errors import UserError
from ablate.core.registry import closest
from components.attention import sdpa
from components.attention.triton import op as triton_op

COMBINED_MAX_SEQ = 256  # the longest sequence `auto` gives `combined` (the only length measured)


@dataclass(frozen=True)
class Backend:
    """One attention backend: its name, what it runs on, how it attends for softmax attention
    (`softmax(q, k, v)`, q (B,H,N,d)) and for differential attention (`diff(q, k, v, lam)`, q and k the
    pairs stacked on dim 1, as `diff_attend_maps` takes them), and what a user reads about it. `auto` has
    no core (`resolve` names another); `require` checks at build time what the backend needs installed."""

    name: str
    runs_on: tuple[str, ...]  # the devices it has a kernel for ("cpu", "cuda")
    about: str
    softmax: Callable[..., torch.Tensor] | None = field(default=None, repr=False)
    diff: Callable[..., torch.Tensor] | None = field(default=None, repr=False)
    require: Callable[[], object] | None = field(default=None, repr=False)


def check_backend(name: str, *, key: str = "backend") -> str:
    """Validate a backend name at build time (and what it needs, e.g. that flash-attn imports)."""
    backend = backend_named(name, key=key)
    if backend.require is not None:
        backend.require()
    return name


def backend_named(name: str, *, key: str = "backend") -> Backend:
    """The row of `TABLE` named `name`; an unknown name is one line naming the closest and the known ones."""
    if name not in TABLE:
        raise UserError(
            f"{key}: unknown attention backend {name!r}{closest(name, BACKENDS)}; known: {', '.join(BACKENDS)}"
        )
    return TABLE[name]


def cpu_has_amx(cpuinfo: str | None = None) -> bool:
    """Whether the CPU has AMX tiles (`amx_bf16` among /proc/cpuinfo's flags; the text is an input so tests
    can pass any CPU; without it, this machine's, read once at import). Read here, not through
    ablate.hardware.precision: components import only the registry's side of the engine
    (tests/ablate/test_layers.py)."""
    return MACHINE_AMX if cpuinfo is None else "amx_bf16" in _cpu_flags(cpuinfo)


def _machine_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _cpu_flags(cpuinfo: str) -> set[str]:
    return {
        f
        for line in cpuinfo.splitlines()
        if line.split(":")[0].strip() == "flags"
        for f in line.split(":", 1)[1].split()
    }


# Read once per process, at import: a constant, so a compiled forward that resolves `auto` reads no file.
MACHINE_AMX = "amx_bf16" in _cpu_flags(_machine_cpuinfo())


def resolve(
    name: str,
    device: torch.device,
    dtype: torch.dtype,
    *,
    diff: bool = False,
    head_dim: int = 64,
    amx: bool | None = None,
    seq_len: int | None = None,
) -> str:
    """The concrete backend `name` means for tensors on `device` of `dtype` (only `auto` depends on them;
    `diff`: for differential attention with sub-heads `head_dim` wide; `amx`: whether the CPU has AMX,
    read from the machine unless given; `seq_len`: the sequence length, where known)."""
    if name != "auto":
        return name
    if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and sdpa.FLASH_ATTN is not None:
        return "flash_attn"
    if device.type == "cuda":
        return cuda_kernel(dtype, head_dim)
    if diff and device.type == "cpu":
        # Measured on CPU (benchmarks/NOTES.md, "auto on CPU"): the blockwise backward's GEMMs win in bf16
        # and for float32 sub-heads of 64; thinner float32 sub-heads run faster in SDPA's padded kernel.
        # Softmax attention gains nothing from the blockwise backward. In bf16 without AMX (AVX512-BF16
        # alone) the padded fused forward is slower than the blocks' one-product forward for sub-heads of
        # 32 and 64 (1.06-1.48x, "auto on CPU" in benchmarks/NOTES.md); with AMX it is faster.
        # Sequences up to 256 ("The `combined` core" in benchmarks/NOTES.md): the maps kept
        # whole and combined before V train the `cpu` and `tiny` models faster than every other core, in
        # float32 and in bf16 without AMX (with AMX not measured).
        amx = cpu_has_amx() if amx is None else amx
        short = seq_len is not None and seq_len <= COMBINED_MAX_SEQ
        if short and (dtype == torch.float32 or (dtype == torch.bfloat16 and not amx)):
            return "combined"
        if dtype == torch.float32:
            return "sdpa_padded" if head_dim < 64 else "blockwise"
        if dtype == torch.bfloat16 and head_dim >= 32 and not amx:
            return "blocks"
        return "blockwise"
    if device.type == "cpu" and dtype == torch.bfloat16 and head_dim >= 64:
        # Softmax heads of 64 in bf16 without AMX: the query blocks beat SDPA's fused kernel (1.14x at
        # 32 x 256, 1.01x at 8 x 1024; benchmarks/NOTES.md, "auto for softmax attention"); thinner heads
        # and float32 stay with SDPA (1.0-3.0x faster there).
        if not (cpu_has_amx() if amx is None else amx):
            return "blocks"
    return "sdpa"


def cuda_kernel(dtype: torch.dtype, width: int) -> str:
    """The SDPA kernel `auto` holds CUDA tensors of `dtype` to, for calls whose q/k/v are `width` wide
    (differential attention's split V makes both calls d wide). SDPA's flash kernel takes fp16/bf16 widths
    up to 256 in multiples of 8; the memory-efficient one any width aligned to 8 (4 in float32), float32 too;
    anything else is left to SDPA's own choice (its math kernel, at worst)."""
    half = dtype in (torch.float16, torch.bfloat16)
    if half and width <= 256 and width % 8 == 0:
        return "sdpa_flash"
    if width % (8 if half else 4) == 0 and dtype in (torch.float16, torch.bfloat16, torch.float32):
        return "sdpa_efficient"
    return "sdpa"


class Resolved:
    """One module's backend: the name it was built with, and the core that name means for each device,
    dtype and sequence length the module has seen, resolved on first use and kept (`auto` is not resolved
    again on every forward call). `diff`, `head_dim`: the module's kind of attention and its width."""

    def __init__(self, name: str, *, diff: bool = False, head_dim: int = 64):
        self.name, self.diff, self.head_dim = name, diff, head_dim
        self._cores: dict[tuple, str] = {}

    def __call__(self, device: torch.device, dtype: torch.dtype, seq_len: int | None = None) -> str:
        if self.name != "auto":
            return self.name
        key = (device.type, device.index, dtype, seq_len if self.diff else None)  # only diff reads seq_len
        if key not in self._cores:
            self._cores[key] = resolve(
                self.name, device, dtype, diff=self.diff, head_dim=self.head_dim, seq_len=key[-1]
            )
        return self._cores[key]


# --- softmax attention -----------------------------------------------------------------------------


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, backend: str, return_weights: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Causal softmax(Q K^T / sqrt(d)) V: q (B,H,N,d), k and v (B,H_kv,N,d) -> (B,H,N,d).

    With `return_weights` the math form runs whatever `backend` says (fused kernels never form the
    maps) and the maps (B,H,N,N) come back too.
    """
    _check_groups(q, k, v)
    if return_weights:
        return _math_maps(q, k, v)
    name = resolve(backend, q.device, q.dtype, head_dim=q.shape[-1])
    return backend_named(name).softmax(q, k, v)


def _math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return _math_maps(q, k, v)[0]


def _math_maps(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    weights = _maps(q, k).to(q.dtype)  # (B,G,R,N,N)
    return (weights @ v.unsqueeze(2)).flatten(1, 2), weights.flatten(1, 2)


# --- differential attention ------------------------------------------------------------------------


def diff_attend(
    q1: torch.Tensor,
    q2: torch.Tensor,
    k1: torch.Tensor,
    k2: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor,
    *,
    backend: str,
    return_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Eq. 1: (softmax(Q1 K1^T / sqrt(d)) - λ softmax(Q2 K2^T / sqrt(d))) V, causal.

    q1, q2 (B,h,N,d); k1, k2 (B,h_kv,N,d); v (B,h_kv,N,2d); lam a 0-dim tensor -> (B,h,N,2d). Q1 of head
    i pairs with K1 of its kv group and Q2 with K2 of the same group. With `return_weights` the math
    form runs and {"a1", "a2", "lambda"} come back too. (`diff_attend_maps` takes the pairs stacked.)
    """
    if q2.shape != q1.shape or k2.shape != k1.shape:
        raise ValueError(f"q2/k2 shapes {tuple(q2.shape)}/{tuple(k2.shape)} differ from q1/k1")
    q, k = torch.stack([q1, q2], dim=1), torch.stack([k1, k2], dim=1)
    return diff_attend_maps(q, k, v, lam, backend=backend, return_weights=return_weights)


def diff_attend_maps(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor,
    *,
    backend: str,
    return_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`diff_attend` with the pairs stacked on dim 1: q (B,2,h,N,d) = [Q1, Q2], k (B,2,h_kv,N,d) = [K1, K2],
    any strides (a view of the reference's interleaved projection is one). The result (B,h,N,2d) is laid
    out (B,N,h,2d) in memory by the fused paths, so merging heads for the output projection is a view.
    """
    q1, k1 = q[:, 0], k[:, 0]
    _check_groups(q1, k1, v, v_width=2 * q1.shape[-1])
    if q.shape[1] != 2 or k.shape[1] != 2:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must stack two maps on dim 1")
    if return_weights:
        return _diff_math_maps(q, k, v, lam)
    name = resolve(backend, q.device, q.dtype, diff=True, head_dim=q.shape[-1], seq_len=q.shape[-2])
    return backend_named(name).diff(q, k, v, lam)


def _diff_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    return _diff_math_maps(q, k, v, lam)[0]


def _diff_math_maps(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lam: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    a1, a2 = _maps(q[:, 0], k[:, 0]), _maps(q[:, 1], k[:, 1])  # float32 (B,G,R,N,N)
    # One product with V, so the FLOPs are a Transformer's with 2h heads of width d.
    diff = (a1 - lam.float() * a2).to(v.dtype)
    out = (diff @ v.unsqueeze(2)).flatten(1, 2)
    return out, {"a1": a1.flatten(1, 2).to(q.dtype), "a2": a2.flatten(1, 2).to(q.dtype), "lambda": lam}


# --- the pieces ------------------------------------------------------------------------------------


def _check_groups(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, v_width: int | None = None) -> None:
    heads, kv_heads = q.shape[1], k.shape[1]
    if q.shape[-1] != k.shape[-1] or v.shape[-1] != (v_width or q.shape[-1]) or v.shape[1] != kv_heads:
        raise ValueError(
            f"attention shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not fit"
        )
    if heads % kv_heads:
        raise ValueError(f"{kv_heads} kv heads do not divide {heads} query heads")


def _maps(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Causal softmax(Q K^T / sqrt(d)) in float32, shaped (B, G, R, N, N): G kv groups of R query heads."""
    return causal_softmax(scaled_logits(q, k))


def scaled_logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Pre-softmax Q K^T / sqrt(d) in float32, (B, G, R, N, N): G kv groups of R query heads, every entry
    (above the diagonal too). The math backend's maps are `causal_softmax` of it, so an analysis path
    built on the two reproduces the math backend bit for bit."""
    heads, width = q.shape[1], q.shape[-1]
    groups = k.shape[1]
    scores = q.unflatten(1, (groups, heads // groups)) @ k.unsqueeze(2).transpose(-1, -2)
    return scores.float().mul(1 / math.sqrt(width))


def causal_softmax(logits: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim with entries above the diagonal masked out (the causal mask)."""
    n = logits.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool, device=logits.device).triu(1)
    return logits.masked_fill(causal, float("-inf")).softmax(dim=-1)


# --- the table -------------------------------------------------------------------------------------

CPU_AND_CUDA, CUDA_ONLY = ("cpu", "cuda"), ("cuda",)


def _blockwise(name: str, about: str, *, fused: bool) -> Backend:
    """The row of a backend on `blockwise.py`'s backward; `fused`: SDPA's fused forward where it serves."""
    softmax = functools.partial(sdpa.blockwise_softmax, fused=fused)
    return Backend(name, CPU_AND_CUDA, about, softmax, functools.partial(sdpa.blockwise_diff, fused=fused))


def _held(name: str, runs_on: tuple[str, ...], kernel: str) -> Backend:
    """The row of an SDPA backend held to one fused kernel (`sdpa.SDPA_KERNELS`)."""
    core = sdpa.held(name)
    about = f"SDPA held to its {kernel} kernel alone (never a silent fall-back); diff in the split-V form"
    return Backend(name, runs_on, about, core, sdpa.split_v(core))


TABLE: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend(
            "auto",
            CPU_AND_CUDA,
            "the fastest measured for the device: on CUDA `flash_attn` for fp16/bf16 when installed, else "
            "`sdpa_flash` for fp16/bf16 widths up to 256, `sdpa_efficient` for float32 or wider heads; on "
            "CPU `sdpa`, except diff: `blockwise`, or `sdpa_padded` for float32 sub-heads under 64 wide, "
            "or `blocks` for bf16 sub-heads of 32 or more on a CPU without AMX, and `combined` for "
            "sequences up to 256 in float32, or bf16 without AMX (benchmarks/NOTES.md)",
        ),
        Backend(
            "math",
            CPU_AND_CUDA,
            "the equations literally, the N x N maps materialised (and returned when asked): the reference",
            softmax=_math,
            diff=_diff_math,
        ),
        Backend(
            "sdpa",
            CPU_AND_CUDA,
            "PyTorch's fused `scaled_dot_product_attention`; diff in the split-V form of Appendix A",
            softmax=sdpa.sdpa_core,
            diff=sdpa.split_v(sdpa.sdpa_core),
        ),
        Backend(
            "sdpa_padded",
            CPU_AND_CUDA,
            "diff: Q and K zero-padded to V's width 2d, both maps and the wide V in one fused call "
            "(softmax: `sdpa`)",
            softmax=sdpa.sdpa_core,
            diff=sdpa.padded,
        ),
        _blockwise(
            "blockwise",
            "SDPA's fused forward (`sdpa_padded` for diff), backward in query blocks of GEMMs with one "
            "(A1 - λ A2) V product; nothing N x N kept",
            fused=True,
        ),
        _blockwise(
            "blocks",
            "forward and backward both in query blocks, no fused kernel: diff's forward combines the maps "
            "before V, Eq. 1's FLOPs in both directions",
            fused=False,
        ),
        Backend(
            "combined",
            CPU_AND_CUDA,
            "diff: both maps kept whole per query block and combined before V, one autograd Function, "
            "nothing recomputed; O(N^2) memory (softmax: `sdpa`)",
            softmax=sdpa.sdpa_core,
            diff=sdpa.combined_diff,
        ),
        Backend(
            "flash_attn",
            CUDA_ONLY,
            "the flash-attn package (`pip install '.[flash]'`), fp16 and bf16; diff in the split-V form "
            "(FlashDiffAttn_2)",
            softmax=sdpa.flash,
            diff=sdpa.split_v(sdpa.flash),
            require=sdpa.flash_attn_func,
        ),
        _held("sdpa_flash", CPU_AND_CUDA, "flash"),
        _held("sdpa_efficient", CUDA_ONLY, "memory-efficient"),
        _held("sdpa_cudnn", CUDA_ONLY, "cuDNN"),
        Backend(
            "triton",
            CUDA_ONLY,
            "our own Triton kernel (`pip install '.[triton]'`): diff's two maps in one pass over K and V "
            "per direction, (A1 - λ A2) V written once, the per-head norm in its epilogue; the backward in "
            "one pass (dQ added by atomics), or two kernels under deterministic algorithms; softmax with "
            "one map; on CPU through Triton's interpreter (exact, slow: for tests); `auto`'s rule never "
            "picks it, a CUDA training run's measured `auto` may (below; benchmarks/NOTES.md has its cost "
            "model)",
            softmax=triton_op.attention,
            diff=triton_op.diff_attention,  # one pass over K and V for both maps, (A1 - λ A2) V once
            require=triton_op.require,
        ),
    )
}
BACKENDS = tuple(TABLE)  # the names, `auto` first
