"""The `triton` backend's kernels as Triton compiles them for a Hopper GPU (`sm_90`, no GPU needed), read
back from the compiled code: registers, spills, shared memory, the matrix instructions, the exponentials
per tile, the waits, and the layouts the products were given.

A launch is compiled as the op makes it: `launch` runs the op's own forward and backward
(components/attention/triton/op.py) on CPU tensors of the real shapes with the kernels replaced by a
recorder, so the arguments, strides and the integers Triton specialises on (16-divisible, equal to 1) are
those of a real call; `compile_launch` then specialises them with Triton's own binder and compiles with
`triton.compile` for the target, through Triton's on-disk cache. What is read comes from the compiler's
output, never the kernel's source:

- from the cubin, disassembled by the `cuobjdump` and `nvdisasm` Triton ships: registers and stack
  (`-res-usage`); spill stores and loads, in bytes, as the local-memory stores and loads (`STL`, `LDL`:
  ptxas's own `-v` counts, which Triton's cache does not keep); `HGMMA` (wgmma) and `HMMA` (mma.sync)
  instructions; the waits on the wgmma group (`WARPGROUP.DEPBAR.LE gsb0, N`: N > 0 leaves N products in
  flight); `MUFU.EX2` in the innermost loops' bodies (one loop iteration is one tile), and those issued
  while a product is in flight (after its group's commit, before a wait that drains it: the overlap of
  the exponentials with the tensor cores that FlashAttention-3 builds);
- from Triton's GPU IR (TTGIR): each product's kind (`ttng.warp_group_dot`: wgmma; `tt.dot` left with an
  `nvidia_mma` v2 layout: mma.sync) and size, and every tensor held in an mma layout smaller than the
  rows and columns its warps cover (8 warps of a wgmma layout cover 128 rows: a 64-row tensor in it is
  computed twice, once per warp group);
- from the metadata: the dynamic shared memory the launch needs, and the global scratch its tensor
  descriptors take;
- the tile loads: `UTMALDG` (the copy engine's, TMA) in the SASS, and the TTGIR's asynchronous copies
  of 2-D tiles by pointers (`cp.async`: what Triton pipelines pointer loads of Q, K, V and dO into).

Why our own: Triton reads registers and spills only when a GPU loads the binary, and nothing reads the
layouts back; these are counts over text the compiler wrote.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from components.attention.triton import configs, op

ARCH = 90  # Hopper: H100, H200
# The op's kernels in the order kernels.kernels gives them, and the chooser's name for each launch.
_ORDER = ("forward", "delta", "backward_kv", "backward_q")


@dataclass(frozen=True)
class Shape:
    """One attention's widths as the model calls the kernel: `maps` 2 (Diff: sub-heads of `width`, V
    2 x width) or 1 (softmax), bf16 by default, `n` tokens (a multiple of 16, as the bench's lengths)."""

    maps: int
    width: int
    heads: int
    n: int = 1024
    dtype: torch.dtype = torch.bfloat16

    @property
    def v_width(self) -> int:
        return self.width * self.maps

    def name(self) -> str:
        kind = "diff" if self.maps == 2 else "softmax"
        return f"{kind} d{self.width} e{self.v_width}"


# The `small` scale's attention (recipes/table6.yaml): Diff at sub-head widths 64 and 128 (V 128, 256),
# the Transformer at 64; bf16, as a GPU trains it.
SHAPES = (Shape(2, 64, 6), Shape(2, 128, 3), Shape(1, 64, 12))


@dataclass(frozen=True)
class Launch:
    """A kernel as the chooser names it (`backward_kv` with `atomic`: the single pass), a config, and
    how its tiles are loaded: `tma`, by tensor descriptors (what the op takes on Hopper for inputs whose
    strides allow it: op.tma_loads), else by pointers (the fallback)."""

    kernel: str
    atomic: bool
    config: configs.Config
    tma: bool = False

    def name(self) -> str:
        kernel = "single pass" if self.kernel == "backward_kv" and self.atomic else self.kernel
        c = self.config
        loads = " tma" if self.tma else ""
        return f"{kernel} {c.block_m}x{c.block_n} w{c.num_warps} s{c.num_stages}{loads}"


@dataclass(frozen=True)
class Dot:
    kind: str  # "wgmma" or "mma.sync" (mma v2) or "fma"
    rows: int
    cols: int


@dataclass
class Compiled:
    """What the compiler made of one launch."""

    registers: int
    stack: int  # bytes of stack frame per thread
    spill_stores: int  # bytes, static (STL)
    spill_loads: int  # bytes, static (LDL)
    shared: int  # bytes of dynamic shared memory per block
    wgmma: int  # HGMMA instructions
    mma_sync: int  # HMMA instructions
    full_waits: int  # WARPGROUP.DEPBAR.LE gsb0, 0x0
    waits_in_flight: int  # WARPGROUP.DEPBAR.LE gsb0, N > 0
    exp2_per_tile: int  # MUFU.EX2 in the innermost loop with the most
    exp2_in_flight: int  # MUFU.EX2 issued while a committed wgmma group is not yet waited for
    tma_loads: int = 0  # UTMALDG: tile loads by the copy engine (PTX cp.async.bulk.tensor)
    tile_async_copies: int = 0  # TTGIR async copies (cp.async, SASS LDGSTS) of 2-D tiles: pointer loads
    scratch: int = 0  # bytes of global scratch per program (the device-side tensor descriptors)
    dots: list[Dot] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)  # "tensor<64x64> in warps [8, 1] x 16 rows"
    num_warps: int = 4

    def blocks_per_sm(self) -> int:
        """Blocks one SM holds by registers (64K per SM, 8-register granules) and shared memory (227 KB
        per block, 228 KB per SM, 1 KB reserved per block)."""
        regs = -(-max(self.registers, 1) // 8) * 8 * 32 * self.num_warps
        by_regs = 65536 // regs
        by_shared = (228 * 1024) // (self.shared + 1024)
        return min(by_regs, by_shared, 64 // self.num_warps)


def candidates(shape: Shape) -> list[Launch]:
    """Every launch the chooser may try for `shape` (configs.candidates), the backward_kv kernel
    both as the single pass (where the op runs it: op.single_pass) and as the deterministic path's
    first kernel; each with pointer loads and, where op.tma_kernel says, with TMA loads (the op chooses
    by the inputs' strides)."""
    kinds = [("forward", False)]
    kinds += [
        ("backward_kv", atomic) for atomic in ((True, False) if op.single_pass(shape.v_width) else (False,))
    ]
    kinds += [("backward_q", False)]
    return [
        Launch(kernel, atomic, c, tma)
        for kernel, atomic in kinds
        for c in configs.candidates(kernel, shape.dtype, shape.v_width)
        for tma in ((False, True) if op.tma_kernel(kernel, shape.v_width, shape.dtype) else (False,))
    ]


class _Recorder:
    """Stands in for a kernel: `kernel[grid](*args, **kwargs)` keeps the call."""

    def __init__(self, name: str, calls: dict):
        self.name, self.calls = name, calls

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            kwargs = dict(kwargs)
            key = (self.name, bool(kwargs.get("ATOMIC", False)))
            self.calls[key] = (args, kwargs)

        return call


def _calls(shape: Shape) -> dict[tuple[str, bool], tuple[tuple, dict]]:
    """(kernel, atomic) -> the arguments the op passes, recorded from its forward and both backward
    paths on CPU tensors of `shape` (one batch row; kv heads = heads)."""
    calls: dict = {}
    recorders = tuple(_Recorder(name, calls) for name in _ORDER)
    b, m, h, n, d = 1, shape.maps, shape.heads, shape.n, shape.width
    q = torch.zeros(b, m, h, n, d, dtype=shape.dtype)
    k = torch.zeros(b, m, h, n, d, dtype=shape.dtype)
    v = torch.zeros(b, h, n, shape.v_width, dtype=shape.dtype)
    lam = torch.zeros((), dtype=torch.float32)
    real = op._kernels
    op._kernels = lambda device: recorders
    try:
        out, o2, lse, _, _ = op._forward(q, k, v, lam, 64, 64)
        for deterministic in (False, True):
            op._backward(out, q, k, v, lam, out, o2, lse, 64, 64, deterministic)
    finally:
        op._kernels = real
    return calls


_CALLS: dict[Shape, dict] = {}


def compile_launch(shape: Shape, launch: Launch):
    """Triton's compiled kernel (`triton.compile` for sm_90) of `launch` at `shape`, specialised as the op's
    own call would be on the GPU."""
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile, make_backend
    from triton.runtime.jit import create_function_from_signature

    from components.attention.triton import kernels

    if shape not in _CALLS:
        _CALLS[shape] = _calls(shape)
    args, kwargs = _CALLS[shape][(launch.kernel, launch.atomic)]
    kernel = kernels.kernels(False)[_ORDER.index(launch.kernel)]
    c = launch.config
    dot = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[shape.dtype]
    kwargs = kwargs | {"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "DOT": dot, "TMA": launch.tma}
    kwargs |= {"num_warps": c.num_warps, "num_stages": c.num_stages}
    target = GPUTarget("cuda", ARCH, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    source = ASTSource(kernel, signature, constexprs, attrs)
    return compile(source, target=target, options=options.__dict__)


def read(compiled, num_warps: int) -> Compiled:
    """The counts of one compiled kernel (`compile_launch`'s result)."""
    from triton import knobs

    with tempfile.TemporaryDirectory() as folder:
        cubin = Path(folder) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = _run(knobs.nvidia.cuobjdump.path, "-res-usage", str(cubin))
        sass = _run(knobs.nvidia.nvdisasm.path, str(cubin))
    registers = int(re.search(r"REG:(\d+)", usage).group(1))
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    waits = [int(n, 16) for n in re.findall(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*(0x[0-9a-f]+)", sass)]
    ttgir = compiled.asm["ttgir"]
    return Compiled(
        registers=registers,
        stack=stack,
        spill_stores=_local_bytes(sass, "STL"),
        spill_loads=_local_bytes(sass, "LDL"),
        shared=int(compiled.metadata.shared),
        wgmma=len(re.findall(r"\bHGMMA\.", sass)),
        mma_sync=len(re.findall(r"\bHMMA\.", sass)),
        full_waits=waits.count(0),
        waits_in_flight=sum(1 for w in waits if w > 0),
        exp2_per_tile=max((body.count("MUFU.EX2") for body in _innermost_loops(sass)), default=0),
        exp2_in_flight=_exp2_in_flight(sass),
        tma_loads=len(re.findall(r"\bUTMALDG\b", sass)),
        tile_async_copies=len(
            re.findall(r"ttg\.async_copy_global_to_local .*tensor<\d+x\d+x!tt\.ptr", ttgir)
        ),
        scratch=int(getattr(compiled.metadata, "global_scratch_size", 0)),
        dots=_dots(ttgir),
        duplicated=_duplicated(ttgir),
        num_warps=num_warps,
    )


def _run(*command: str) -> str:
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def _exp2_in_flight(sass: str) -> int:
    """MUFU.EX2 between a wgmma group's commit (`HGMMA ... gsb0`) and the next full wait, in program order:
    exponentials the SM computes while the tensor cores work (a wait with N > 0 leaves them working)."""
    count, in_flight = 0, False
    for line in sass.splitlines():
        if re.search(r"\bHGMMA\..*\bgsb0\b", line):
            in_flight = True
        elif m := re.search(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*(0x[0-9a-f]+)", line):
            in_flight = in_flight and int(m.group(1), 16) > 0
        elif in_flight and "MUFU.EX2" in line:
            count += 1
    return count


_WIDTH = {"": 4, "U8": 1, "S8": 1, "U16": 2, "S16": 2, "32": 4, "64": 8, "128": 16}


def _local_bytes(sass: str, instruction: str) -> int:
    """Bytes moved by the `instruction` (STL or LDL) instructions, each once: `STL.64` moves 8 bytes."""
    total = 0
    for suffixes in re.findall(rf"\b{instruction}((?:\.[A-Z0-9]+)*)\s", sass):
        sizes = [_WIDTH[s] for s in suffixes.split(".")[1:] if s in _WIDTH]
        total += sizes[0] if sizes else 4
    return total


def _innermost_loops(sass: str) -> list[str]:
    """The text of every loop body with no loop inside: a label and a later branch back to it."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^(\.L_x_\d+):", line))}
    loops = []
    for i, line in enumerate(lines):
        m = re.search(r"\bBRA\b[^`]*`\((\.L_x_\d+)\)", line)
        if m and labels.get(m.group(1), i) < i:
            loops.append((labels[m.group(1)], i))
    inner = [(a, b) for a, b in loops if not any(a < c and d <= b and (c, d) != (a, b) for c, d in loops)]
    return ["\n".join(lines[a : b + 1]) for a, b in inner]


_LAYOUT = re.compile(
    r"^#(mma\d*) = #ttg\.nvidia_mma<\{versionMajor = (\d+),.*?warpsPerCTA = \[(\d+), (\d+)\]"
    r".*?instrShape = \[(\d+), (\d+)",
    re.M,
)


def _layouts(ttgir: str) -> dict[str, tuple[int, int, int, int, int]]:
    """mma layout name -> (version, warps on rows, warps on columns, rows, columns per warp's instruction)."""
    return {m.group(1): tuple(int(g) for g in m.groups()[1:]) for m in _LAYOUT.finditer(ttgir)}


def _dots(ttgir: str) -> list[Dot]:
    layouts = _layouts(ttgir)
    dots = []
    for line in ttgir.splitlines():
        kind = (
            "wgmma"
            if "ttng.warp_group_dot " in line
            else ("dot" if re.search(r"\btt\.dot\b", line) else None)
        )
        if kind is None:
            continue
        m = re.search(r"->\s*tensor<(\d+)x(\d+)x\w+, #(\w+)>", line)
        if not m:
            continue
        rows, cols, layout = int(m.group(1)), int(m.group(2)), m.group(3)
        if kind == "dot":
            kind = "mma.sync" if layout in layouts else "fma"
        dots.append(Dot(kind, rows, cols))
    return dots


def _duplicated(ttgir: str) -> list[str]:
    """Every distinct tensor type held in an mma layout whose warps cover more rows or columns than it has."""
    layouts = _layouts(ttgir)
    found = set()
    for rows, cols, name in re.findall(r"tensor<(\d+)x(\d+)x\w+, #(mma\d*)>", ttgir):
        _, warps_m, warps_n, instr_m, instr_n = layouts[name]
        # rows: 16 per warp in both versions (a wgmma warp group's 64 rows are its 4 warps' 16 each)
        short = [(n, cover) for n, cover in ((int(rows), warps_m * instr_m), (int(cols), warps_n * instr_n))]
        if any(1 < n < cover for n, cover in short):  # a dimension of 1 is a broadcast row or column
            found.add(f"tensor<{rows}x{cols}> in warps [{warps_m}, {warps_n}] x {instr_m}x{instr_n}")
    return sorted(found)


def inspect(shape: Shape, launch: Launch) -> Compiled:
    """`launch` at `shape` compiled for sm_90 and read back (Triton's cache makes a second call cheap)."""
    return read(compile_launch(shape, launch), launch.config.num_warps)
