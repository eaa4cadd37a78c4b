"""Which attention backend `auto` should pick on this CPU: the attention core alone (forward + backward,
8192 tokens per call), every CPU backend, the shapes of benchmarks/NOTES.md's "auto on CPU" table, for
differential attention (default) or softmax attention (`--attention softmax`: the Transformer rows, whose
heads are d wide where Diff's sub-heads are). Prints one Markdown table (median ms of `--rounds`, the
fastest marked) and the backend `auto` picks for each case, so a disagreement between the rule and this
machine shows.

    python benchmarks/auto_backends.py --dtypes float32 bfloat16
    python benchmarks/auto_backends.py --attention softmax --dtypes bfloat16
    # an approximation of an AVX2-only CPU on an AVX-512 one (ATen, oneDNN and MKL kernels held to AVX2):
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python benchmarks/auto_backends.py --dtypes float32

A script, not a verb: it measures the library's own choice, for the notes. Timing uses the device seam
(ablate.hardware.device), the clock `ablate bench` uses.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from ablate.hardware.device import device_ops, median_ms
from components.attention import blockwise
from components.attention.backends import attend, diff_attend_maps, resolve

CASES = [  # (sub-head width d, heads h, batch, sequence): 8192 tokens each
    (16, 4, 32, 256),
    (16, 4, 8, 1024),
    (32, 4, 32, 256),
    (32, 4, 8, 1024),
    (64, 6, 32, 256),
    (64, 6, 8, 1024),
]
BACKENDS = ("sdpa", "sdpa_padded", "blockwise")
# Not a backend: the blockwise core with its own forward in query blocks ((A1 - λ A2) V, one product,
# blocks above the diagonal skipped) instead of the padded fused forward: does it win?
BLOCK_FORWARD = "blockwise (block fwd)"
ARMS = (*BACKENDS, BLOCK_FORWARD)
SOFTMAX_ARMS = ("sdpa", "blockwise", "blocks")  # softmax attention: SDPA's fused kernel or query blocks


def softmax_core_ms(
    backend: str, d: int, h: int, batch: int, n: int, dtype: torch.dtype, rounds: int
) -> float:
    """Median wall time (ms) of one forward + backward of causal softmax attention, 2h heads of width d
    (a Transformer row of the same recipe: twice Diff's heads)."""
    ops = device_ops("cpu")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, 2 * h, n, d, generator=gen).to(dtype).requires_grad_() for _ in range(3))
    grad = torch.randn(batch, 2 * h, n, d, generator=gen).to(dtype)

    def step() -> None:
        attend(q, k, v, backend=backend).backward(grad)

    return median_ms(ops, step, rounds)


def core_ms(backend: str, d: int, h: int, batch: int, n: int, dtype: torch.dtype, rounds: int) -> float:
    """Median wall time (ms) of one forward + backward of the differential attention core."""
    ops = device_ops("cpu")
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch, 2, h, n, d, generator=gen).to(dtype).requires_grad_()
    k = torch.randn(batch, 2, h, n, d, generator=gen).to(dtype).requires_grad_()
    v = torch.randn(batch, h, n, 2 * d, generator=gen).to(dtype).requires_grad_()
    lam = torch.tensor(0.5, requires_grad=True)
    grad = torch.randn(batch, h, n, 2 * d, generator=gen).to(dtype)

    def step() -> None:
        if backend == BLOCK_FORWARD:
            out = blockwise.attention(q.unflatten(2, (h, 1)), k, v, lam, fused_forward=None).flatten(1, 2)
        else:
            out = diff_attend_maps(q, k, v, lam, backend=backend)
        out.backward(grad)

    return median_ms(ops, step, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--attention", choices=("diff", "softmax"), default="diff")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    isa = {
        k: os.environ[k]
        for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
        if k in os.environ
    }
    words = {
        w
        for line in Path("/proc/cpuinfo").read_text().splitlines()
        if line.startswith("flags")
        for w in line.split()
    }
    flags = sorted(words & {"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
    print(f"CPU flags: {', '.join(flags)}; threads {torch.get_num_threads()}; ISA limits: {isa or 'none'}")
    print(f"torch.backends.cpu.get_cpu_capability(): {torch.backends.cpu.get_cpu_capability()}\n")
    diff = args.attention == "diff"
    arms, timer = (ARMS, core_ms) if diff else (SOFTMAX_ARMS, softmax_core_ms)
    print(f"{args.attention} attention")
    print("| dtype | d | h | batch x N | " + " | ".join(arms) + " | fastest | auto picks |")
    print("|---|---:|---:|---|" + "---:|" * len(arms) + "---|---|")
    for name in args.dtypes:
        dtype = getattr(torch, name)
        for d, h, batch, n in CASES:
            ms = {b: timer(b, d, h, batch, n, dtype, args.rounds) for b in arms}
            best = min(ms, key=ms.get)
            picked = resolve("auto", torch.device("cpu"), dtype, diff=diff, head_dim=d)
            cells = " | ".join(f"**{ms[b]:.1f}**" if b == best else f"{ms[b]:.1f}" for b in arms)
            off = "" if picked == best else f" ({ms[picked] / ms[best]:.2f}x the fastest)"
            print(f"| {name} | {d} | {h} | {batch} x {n} | {cells} | {best} | {picked}{off} |", flush=True)


if __name__ == "__main__":
    main()
