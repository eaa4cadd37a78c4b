"""The `triton` kernels compiled for Hopper (`sm_90`) on this CPU, every launch configuration the chooser
may try (components/attention/triton/configs.py), read back from the compiled code
(components/attention/triton/compiled.py): registers, spills, shared memory, blocks per SM, the matrix
instructions, exponentials per tile, the waits on the tensor cores, and duplicated layouts. Prints one
Markdown table (and writes it with `--out`).

    python benchmarks/triton_sm90.py --out benchmarks/triton_sm90_tma.md

Shapes: the `small` scale's attention (recipes/table6.yaml), Diff at sub-head widths 64 (V 128) and 128
(V 256) and the Transformer at 64, bf16, 1,024 tokens (the lengths the bench runs are all 16-divisible,
which is what Triton specialises on). Columns:

- regs, spill st/ld (bytes, static), shared (KB per block), blocks/SM (by registers and shared memory);
- wgmma / mma.sync: `HGMMA` and `HMMA` instructions in the SASS; products: the TTGIR's products as
  wgmma + mma.sync (a 64-row-or-larger product on mma.sync is marked !);
- exp2/tile: `MUFU.EX2` per thread in the loop body with the most, beside the ideal: each map's
  BLOCK_M x BLOCK_N entries over the block's threads (twice the ideal: every entry computed twice);
- exp2 under products: `MUFU.EX2` issued while a wgmma group is in flight (the overlap of the softmax
  with the tensor cores);
- waits: wgmma waits with products left in flight / full waits (`pendings = 0`);
- UTMALDG / tile cp.async: tile loads by the copy engine (TMA: a launch named `tma`) in the SASS, and
  the TTGIR's asynchronous copies of 2-D tiles by pointers (Q, K, V, dO pipelined by `cp.async`);
- scratch B: global scratch per program (the device-side tensor descriptors);
- duplicated: mma-layout tensors smaller than the rows or columns their warps cover.

A script, not a verb: it reads what a compiler made, for benchmarks/NOTES.md; about 5 s per launch on one
core of the 2-core AMD EPYC, seconds when Triton's cache holds it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from components.attention.triton.compiled import SHAPES, Compiled, Launch, Shape, candidates, inspect

COLUMNS = ("shape", "launch", "regs", "spill st/ld", "shared KB", "blocks/SM", "wgmma", "mma.sync", "products",
           "exp2/tile (ideal)", "exp2 under products", "waits in flight/full", "UTMALDG / tile cp.async",
           "scratch B", "duplicated")  # fmt: skip


def ideal_exp2(shape: Shape, launch: Launch) -> int:
    c = launch.config
    return shape.maps * c.block_m * c.block_n // (32 * c.num_warps)


def row(shape: Shape, launch: Launch, compiled: Compiled) -> list[str]:
    wide = [d for d in compiled.dots if d.kind == "mma.sync" and d.rows >= 64]
    products = f"{sum(d.kind == 'wgmma' for d in compiled.dots)} + {sum(d.kind == 'mma.sync' for d in compiled.dots)}"
    return [
        shape.name(),
        launch.name(),
        str(compiled.registers),
        f"{compiled.spill_stores} / {compiled.spill_loads}",
        f"{compiled.shared / 1024:.0f}",
        str(compiled.blocks_per_sm()),
        str(compiled.wgmma),
        str(compiled.mma_sync),
        products + (" !" if wide else ""),
        f"{compiled.exp2_per_tile} ({ideal_exp2(shape, launch)})",
        str(compiled.exp2_in_flight),
        f"{compiled.waits_in_flight} / {compiled.full_waits}",
        f"{compiled.tma_loads} / {compiled.tile_async_copies}",
        str(compiled.scratch),
        str(len(compiled.duplicated)) if compiled.duplicated else "",
    ]


def table(shapes=SHAPES, progress=None) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for shape in shapes:
        for launch in candidates(shape):
            start = time.perf_counter()
            cells = row(shape, launch, inspect(shape, launch))
            if progress:
                print(f"{shape.name()} {launch.name()}: {time.perf_counter() - start:.1f} s", file=progress)
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    text = table(progress=sys.stderr)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
