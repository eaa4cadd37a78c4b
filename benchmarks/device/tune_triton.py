"""The fused Triton differential attention's launch configurations, timed on a GPU (not a part of the
check: a short run beside it, from which `components/attention/triton/op.py`'s tiles are chosen).

For each (BLOCK_M, BLOCK_N, num_warps, num_stages) in CONFIGS: median ms of one forward + backward of
Diff's attention core at the `small` widths (6 heads of 2 x 64, V 128 wide) in bf16, 16,384 tokens at
each sequence in `--seqs`, beside the Transformer on SDPA's flash kernel (the part t baseline). A
configuration the card cannot launch (registers, shared memory) is a row with its error. Rows are written as each ends (`tune_triton.csv` in `--out`).

    python benchmarks/device/tune_triton.py --out DIR [--seqs 2048 8192]
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from diff_kernel import core, dense_backward  # noqa: E402  benchmarks/device/diff_kernel.py (part t)

from ablate.hardware.device import device_ops, median_ms  # noqa: E402
from components.attention.triton import op as triton_op  # noqa: E402

# (BLOCK_M, BLOCK_N, num_warps, num_stages): the first was triton_op's launch for this shape before an
# H200 timed these (reports/gpu-h200/tune_triton.csv); the fifth is its launch since
CONFIGS = [
    (64, 64, 8, 2), (64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 8, 3), (128, 64, 8, 2), (128, 64, 8, 3),
    (64, 32, 4, 2), (128, 32, 8, 2), (32, 64, 4, 2), (128, 128, 8, 2),
]  # fmt: skip
WIDTH, HEADS, TOKENS, ROUNDS = 64, 6, 16384, 5


def leaves(batch: int, n: int, device, gen):
    def leaf(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=torch.bfloat16).requires_grad_()

    return leaf(batch, 2, HEADS, n, WIDTH), leaf(batch, 2, HEADS, n, WIDTH), leaf(batch, HEADS, n, 2 * WIDTH)


def config_ms(ops, q, k, v, lam, config: tuple[int, int, int, int], rounds: int) -> float:
    """Diff's core on the kernel launched with `config` (BLOCK_M, BLOCK_N, num_warps, num_stages)."""
    block_m, block_n, warps, stages = config
    launch = triton_op._launch_options

    def options(*args, **kwargs):
        tuned = {"num_warps": warps, "num_stages": stages} if q.device.type == "cuda" else {}
        return launch(*args, **kwargs) | tuned  # the interpreter takes no launch options

    triton_op._launch_options = options
    try:
        backward = dense_backward()
        step = lambda: backward(torch.ops.ablate.triton_attention(q, k, v, lam, block_m, block_n)[0])  # noqa: E731
        return median_ms(ops, step, rounds)
    finally:
        triton_op._launch_options = launch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seqs", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--tokens", type=int, default=TOKENS, help="tokens per step (batch = tokens // seq)")
    parser.add_argument(
        "--device", default="cuda", help="cpu: Triton's interpreter, a smoke run at tiny sizes"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    ops = device_ops(args.device)
    rounds = ROUNDS if device.type == "cuda" else 1
    columns = ["seq", "batch", "arm", "block_m", "block_n", "num_warps", "num_stages", "ms_fwd_bwd", "ratio",
               "note"]  # fmt: skip
    with (args.out / "tune_triton.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for n in args.seqs:
            batch = max(1, args.tokens // n)
            gen = torch.Generator().manual_seed(0)
            transformer = core("softmax", "sdpa_flash", batch, n, WIDTH, HEADS, torch.bfloat16, device)
            base = median_ms(ops, transformer, rounds)  # part t's baseline, its code
            writer.writerow({"seq": n, "batch": batch, "arm": "transformer_sdpa_flash", "ms_fwd_bwd": round(base, 3),
                             "ratio": 1.0})  # fmt: skip
            q, k, v = leaves(batch, n, device, gen)
            lam = torch.tensor(0.4, device=device, requires_grad=True)
            for config in CONFIGS:
                row = {"seq": n, "batch": batch, "arm": "diff_triton"}
                row |= dict(zip(["block_m", "block_n", "num_warps", "num_stages"], config, strict=True))
                try:
                    ms = config_ms(ops, q, k, v, lam, config, rounds)
                    row |= {"ms_fwd_bwd": round(ms, 3), "ratio": round(base / ms, 3)}
                except Exception as e:  # noqa: BLE001 - a configuration the card cannot launch is its row
                    row["note"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
                writer.writerow(row)
                f.flush()
                print(row, flush=True)


if __name__ == "__main__":
    main()
