"""The `triton` kernels as Triton compiles them for Hopper (`sm_90`, on this CPU: no GPU needed), read back
from the compiled code (components/attention/triton/compiled.py), never the kernel's source.

Every launch configuration the chooser may try (components/attention/triton/configs.py), at the model's
widths (Diff sub-heads of 64 and 128, the Transformer's 64, bf16), compiled as the op calls it; each fails
on any of: a spill in the forward or the single-pass backward; a duplicated layout (warps covering more
rows or columns than a tensor has: 8 warps over a 64-row tile); a product of 64 rows or more on mma.sync
instead of wgmma; a Diff forward on wgmma whose products are followed only by full waits with nothing
computed under them (no exponential issued while a product is in flight: Triton's `tl.dot` waits with
`pendings = 0` after every product the loop reads, so the overlap is read as exponentials issued between
a product's commit and the wait that drains it); a launch with TMA loads (the op's choice where the
inputs' strides allow it) without `UTMALDG` or with a tile of Q, K, V or dO still copied by `cp.async`,
or a launch with pointer loads (the fallback) with `UTMALDG`. The reader itself is checked against ptxas's own count
and on a launch known to be duplicated, and it runs with TRITON_INTERPRET=1 set.

Cost: about 5 s per launch cold on one core of the 2-core AMD EPYC; Triton's on-disk cache makes a second
run a fraction of that.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("triton")

from components.attention.triton import compiled as triton_compiled  # noqa: E402
from components.attention.triton.compiled import SHAPES, Launch, Shape, candidates, compile_launch, inspect  # noqa: E402
from components.attention.triton.configs import Config  # noqa: E402

LAUNCHES = [(shape, launch) for shape in SHAPES for launch in candidates(shape)]


def _id(case) -> str:
    shape, launch = case
    return f"{shape.name()} {launch.name()}".replace(" ", "-")


@pytest.mark.parametrize("case", LAUNCHES, ids=[_id(c) for c in LAUNCHES])
def test_a_chooser_configuration_compiles_for_hopper_without_waste(case):
    shape, launch = case
    compiled = inspect(shape, launch)
    problems = []
    single_pass = launch.kernel == "backward_kv" and launch.atomic
    if (launch.kernel == "forward" or single_pass) and (compiled.spill_stores or compiled.spill_loads):
        problems.append(f"spills {compiled.spill_stores} / {compiled.spill_loads} bytes")
    if compiled.duplicated:
        problems.append(f"duplicated layouts: {compiled.duplicated}")
    wide = sorted({(d.rows, d.cols) for d in compiled.dots if d.kind != "wgmma" and d.rows >= 64})
    if wide:
        problems.append(f"products of 64 rows or more not on wgmma: {wide}")
    if launch.kernel == "forward" and shape.maps == 2 and compiled.wgmma and not compiled.exp2_in_flight:
        problems.append(f"no exponential under a product in flight ({compiled.full_waits} full waits)")
    if launch.tma and (not compiled.tma_loads or compiled.tile_async_copies):
        problems.append(f"TMA: {compiled.tma_loads} UTMALDG, {compiled.tile_async_copies} tiles by cp.async")
    if not launch.tma and compiled.tma_loads:
        problems.append(f"pointer loads: {compiled.tma_loads} UTMALDG")
    assert not problems, f"{shape.name()} {launch.name()}: " + "; ".join(problems)


DUPLICATED = (Shape(2, 64, 6), Launch("forward", False, Config(64, 64, 8, 2)))  # 8 warps on 64 rows


def test_the_reader_sees_a_duplicated_layout():
    """8 warps on a 64-row tile: Triton gives the scores a layout of 128 rows, both warp groups compute
    the tile, and each thread takes twice the exponentials its share needs."""
    shape, launch = DUPLICATED
    compiled = inspect(shape, launch)
    assert any(t.startswith("tensor<64x64>") for t in compiled.duplicated), compiled.duplicated
    ideal = shape.maps * 64 * 64 // (32 * 8)
    assert compiled.exp2_per_tile >= 2 * ideal


def test_the_reader_agrees_with_ptxas():
    """Registers and spill bytes read from the cubin's SASS are what ptxas -v says of the same PTX."""
    from triton.backends.nvidia.compiler import get_ptxas

    shape, launch = Shape(2, 64, 6), Launch("backward_kv", True, Config(64, 64, 8, 2))  # known to spill
    compiled = compile_launch(shape, launch)
    read = triton_compiled.read(compiled, 8)
    with tempfile.TemporaryDirectory() as folder:
        ptx = Path(folder) / "kernel.ptx"
        ptx.write_text(compiled.asm["ptx"])
        ptxas = get_ptxas(triton_compiled.ARCH).path  # the one Triton compiles with
        log = subprocess.run(
            [ptxas, "-v", "-lineinfo", "--regAllocOptLevel=2", "--gpu-name=sm_90a", str(ptx), "-o", str(ptx) + ".o"],
            capture_output=True, text=True, check=True,
        ).stderr  # fmt: skip
    stores, loads = (
        int(n) for n in re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log).groups()
    )
    registers = int(re.search(r"Used (\d+) registers", log).group(1))
    assert (read.registers, read.spill_stores, read.spill_loads) == (registers, stores, loads)
    assert stores > 0


INTERPRET = """
from components.attention.triton.compiled import Launch, Shape, inspect
from components.attention.triton.configs import Config
compiled = inspect(Shape(1, 64, 12), Launch("forward", False, Config(64, 64, 4, 2)))
print("wgmma", compiled.wgmma)
"""


def test_it_compiles_with_triton_interpret_set():
    """TRITON_INTERPRET=1 makes `triton.jit` and Triton's own jit functions interpreted from the import on;
    the compiled kind is made without it (components/attention/triton/kernels.py)."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", INTERPRET], cwd=root, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(re.search(r"wgmma (\d+)", out.stdout).group(1)) > 0
