"""Part (t) of the device check: the `triton` backend's fused kernel (components/attention/triton/kernels.py)
on the device, checked, then timed against what Diff runs without it and against the Transformer.

1. `t_kernel.csv`: the kernel against float64 (`backend_check.check_one`, the formulas of part a): Diff (two
   maps) and softmax (one), float32 and bf16, all heads and grouped kv heads, a sequence that ends inside
   a tile; the output's and the largest gradient's relative error (q, k, v, λ), pass/FAIL.
2. `t_bench.csv`: median ms of one forward + backward of one layer's attention core at the `small`
   widths in bf16 (Transformer 12 heads of 64, Diff 6 heads of 2 x 64), 16,384 tokens at each sequence
   1024-8192 (the backward from a dense dO of its own, as the model's): the Transformer on SDPA's flash kernel (the baseline), Diff split V on the same kernel
   (`sdpa_flash`), Diff on the kernel, and the Transformer on the kernel with one map (the same code
   for both arms). Beside each, its throughput against the baseline, measured, and the ratio
   `benchmarks/diff_kernel_cost.py` predicted for that card (written before any GPU ran it).
3. `t_kernel.md`: both as tables.

Rows are written as each ends, so a part stopped at its box keeps what it measured. `--dry` on CPU runs
the same steps through Triton's interpreter at tiny sizes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from backend_check import Rows, check_one, write_device  # benchmarks/device/backend_check.py (part a)

from ablate.hardware.device import device_ops, median_ms
from components.attention import backends

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the cost model
import diff_kernel_cost  # noqa: E402

# arm -> (attention kind, backend, the cost model's form: its predicted ratio)
ARMS = {
    "transformer_sdpa_flash": ("softmax", "sdpa_flash", "transformer"),
    "diff_split_v_sdpa_flash": ("diff", "sdpa_flash", "split_v"),
    "diff_triton": ("diff", "triton", "triton"),
    "transformer_triton": ("softmax", "triton", None),
}
BASELINE = "transformer_sdpa_flash"


def card_of(name: str) -> str | None:
    """The cost model's card for a device name ("NVIDIA H200" -> "H200"), or None."""
    return next((c for c in diff_kernel_cost.CARDS if c in name), None)


def core(kind: str, backend: str, batch: int, n: int, width: int, heads: int, dtype, device):
    """Inputs of one layer's core as its component makes them, and a step of forward + backward."""
    gen = torch.Generator().manual_seed(0)
    backward = dense_backward()

    def leaf(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype).requires_grad_()

    if kind == "softmax":
        q, k, v = (
            leaf(batch, 2 * heads, n, width),
            leaf(batch, 2 * heads, n, width),
            leaf(batch, 2 * heads, n, width),
        )
        return lambda: backward(backends.attend(q, k, v, backend=backend))
    q, k, v = (
        leaf(batch, 2, heads, n, width),
        leaf(batch, 2, heads, n, width),
        leaf(batch, heads, n, 2 * width),
    )
    lam = torch.tensor(0.4, device=device, requires_grad=True)
    return lambda: backward(backends.diff_attend_maps(q, k, v, lam, backend=backend))


def dense_backward():
    """`backward(out)`: out's backward from a gradient of its own, dense and laid out as out (as the output
    projection's backward hands it), made once; `.sum().backward()` would hand an expanded tensor of
    stride 0, whose reads all hit one cached line."""
    grads: dict = {}

    def backward(out: torch.Tensor) -> None:
        key = (tuple(out.shape), out.stride())
        if key not in grads:
            grads[key] = torch.randn_like(out)
        out.backward(grads[key])

    return backward


def main(ctx) -> None:
    out, dry = ctx.out, ctx.dry
    write_device(out, ctx.device)
    device = torch.device(ctx.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    card = card_of(name)
    columns = ["kind", "backend", "dtype", "kv_heads", "seq", "width", "heads", "out_rel_err", "grad_rel_err",
               "tolerance", "status", "note"]  # fmt: skip
    checks = Rows(out / "t_kernel.csv", columns)
    # 208 = 3 tiles of 64 and 16 rows: a multiple of 16, as the bench's lengths, so Triton compiles one
    # specialisation of each kernel for both (it specialises integers on divisibility by 16)
    n, d, heads = (20, 16, 2) if dry else (208, 64, 4)
    for kind in ("diff", "softmax"):
        for dtype in (torch.float32, torch.bfloat16):
            for kv_heads in (heads, heads // 2):
                checks.add(check_one(kind, "triton", dtype, kv_heads, device, n, d, heads))
                row = checks.rows[-1]
                print(
                    f"[t] {kind} {row['dtype']} kv {kv_heads}: {row['status']} {row.get('note', '')}",
                    flush=True,
                )
    seqs, tokens, width, heads, dtype, rounds = (
        ((32,), 96, 16, 2, torch.float32, 1) if dry else ((1024, 2048, 4096, 8192), 16384, 64, 6, torch.bfloat16, 5)
    )  # fmt: skip
    ops = device_ops(device.type if device.type == "cpu" else str(device))
    bench = Rows(out / "t_bench.csv", ["arm", "seq", "batch", "ms_fwd_bwd", "measured_ratio", "predicted_ratio", "card",
                                      "note"])  # fmt: skip
    for n in seqs:
        batch = max(1, tokens // n)
        predicted = diff_kernel_cost.predict(card, n) if card else {}
        base_ms = None
        for arm, (kind, backend, form) in ARMS.items():
            row = {"arm": arm, "seq": n, "batch": batch, "card": card or name}
            try:
                ms = median_ms(ops, core(kind, backend, batch, n, width, heads, dtype, device), rounds)
            except Exception as e:  # noqa: BLE001 - an arm that fails is that row's result, the rest go on
                bench.add(row | {"note": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"})
                continue
            base_ms = ms if arm == BASELINE else base_ms
            row |= {"ms_fwd_bwd": round(ms, 3), "measured_ratio": round(base_ms / ms, 3) if base_ms else ""}
            row["predicted_ratio"] = round(predicted[form], 2) if form in predicted else ""
            bench.add(row)
            print(f"[t] {arm} seq {n}: {ms:.2f} ms, ratio {row['measured_ratio']} "
                  f"(predicted {row['predicted_ratio'] or '-'})", flush=True)  # fmt: skip
    write_tables(out, checks.rows, bench.rows)
    failed = [r for r in checks.rows if r["status"] in ("FAIL", "error")]
    print(f"[t] {len(checks.rows)} checks, {len(failed)} failed; {len(bench.rows)} timings", flush=True)
    if failed:
        raise SystemExit(1)


def write_tables(out: Path, checks: list[dict], bench: list[dict]) -> None:
    def table(rows, columns):
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        return lines + ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows]

    lines = ["# (t) the `triton` kernel", "", "Against float64 (relative Frobenius error):", ""]
    lines += table(
        checks, ["kind", "dtype", "kv_heads", "seq", "width", "out_rel_err", "grad_rel_err", "status"]
    )
    lines += ["", "Attention core, forward + backward; ratio = the baseline's ms / the arm's (throughput against",
              "the Transformer on SDPA flash), measured beside benchmarks/diff_kernel_cost.py's prediction:", ""]  # fmt: skip
    lines += table(bench, ["arm", "seq", "batch", "ms_fwd_bwd", "measured_ratio", "predicted_ratio", "note"])
    (out / "t_kernel.md").write_text("\n".join(lines) + "\n")
