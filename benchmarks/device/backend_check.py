"""Part (a) of the device check: every attention kind and backend on the device against float64
formulas written here (forward and gradients), which SDPA kernel each one ran, and how long a forward +
backward of each takes at the `small` scale's attention shape.

Writes `device.json` (the card, torch, CUDA) first, then `a_kernels.csv` (one row per kind, backend,
dtype and kv-head count: the relative Frobenius error of the output and the largest of the gradients'
against float64 (λ's against the root-sum-square of the terms its sum adds: `lambda_grad_err`), the tolerance, pass/fail, or n/a with the reason where the backend has no kernel there)
and `a_timing.csv` (median ms of forward + backward), a row at a time as each check ends: a part stopped
at its box keeps every check it made. A check that raises anything is an `error` row, and the rest go on.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from ablate.core.errors import UserError
from ablate.hardware.device import device_ops, median_ms
from components.attention import backends

TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 3e-2}  # relative Frobenius error, outputs and gradients
KINDS = ("softmax", "diff")
# Every backend but `triton`, which part t (diff_kernel.py) checks and times: its kernels compile on first
# use, which part a's box is not sized for.
CHECKED = tuple(b for b in backends.BACKENDS if b != "triton")


def reference(kind: str, q, k, v, lam):
    """float64, from the equations: causal softmax(Q K^T / sqrt(d)) V; for diff, Eq. 1 with the maps formed,
    (A1 - λ A2) V. kv heads are repeated to their query heads (query head i reads kv head i // (H / H_kv))."""
    q, k, v = q.double(), k.double(), v.double()
    d, n = q.shape[-1], q.shape[-2]
    mask = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)

    def maps(qs, ks):
        ks = ks.repeat_interleave(qs.shape[1] // ks.shape[1], 1)
        return (qs @ ks.transpose(-1, -2) / d**0.5).masked_fill(mask, float("-inf")).softmax(-1)

    if kind == "softmax":
        return maps(q, k) @ v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    a = maps(q[:, 0], k[:, 0]) - lam.double() * maps(q[:, 1], k[:, 1])
    return a @ v.repeat_interleave(q.shape[2] // v.shape[1], 1)


def inputs(kind: str, n: int, d: int, heads: int, kv_heads: int, dtype, device, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)

    def leaf(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype).requires_grad_()

    lam = torch.tensor(0.4, device=device, requires_grad=True)
    if kind == "softmax":
        return leaf(2, heads, n, d), leaf(2, kv_heads, n, d), leaf(2, kv_heads, n, d), lam
    return leaf(2, 2, heads, n, d), leaf(2, 2, kv_heads, n, d), leaf(2, kv_heads, n, 2 * d), lam


def run(kind: str, backend: str, q, k, v, lam):
    if kind == "softmax":
        return backends.attend(q, k, v, backend=backend)
    return backends.diff_attend_maps(q, k, v, lam, backend=backend)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b).norm() / b.norm()).item()


def lambda_grad_err(got: torch.Tensor, want: torch.Tensor, qkv: list[torch.Tensor], grad_out) -> float:
    """λ's gradient error against the scale of the sum that makes it, not against its own value.

    dL/dλ = -Σ (A2 V ⊙ dO) is one scalar summed over every output element, and its terms cancel: on
    random inputs its value can be a small fraction of their sizes, and a bf16 kernel's rounding of each
    term (relative 2^-8) then shows as a large error relative to the value (0.11 for the `math` backend,
    0.48 for SDPA's kernels, with dλ = -1.85, on an H200; every q, k, v gradient of the same runs within
    0.005). Terms rounded independently add errors like a random walk, about the unit error times the
    terms' root-sum-square, so the error is |got - want| / |A2 V ⊙ dO|_F, in the units of the other
    columns' relative errors. It still fails a wrong dλ wherever dλ is not itself inside the rounding.
    A2 V in float64 is the output's slope in λ: out(0) - out(1).
    """
    with torch.no_grad():
        q, k, v = (t.detach() for t in qkv)
        zero, one = (torch.tensor(x, dtype=torch.float64, device=q.device) for x in (0.0, 1.0))
        slope = reference("diff", q, k, v, zero) - reference("diff", q, k, v, one)
        scale = (slope * grad_out.double()).norm()
    return (abs(got.double() - want) / scale).item()


def sdpa_ops(fn) -> str:
    """The SDPA operators (and so the fused kernel) that ran, e.g. `_scaled_dot_product_flash_attention x2`."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    ops = {e.key: e.count for e in prof.key_averages() if "scaled_dot_product" in e.key or "flash" in e.key}
    return "; ".join(f"{k.removeprefix('aten::')} x{c}" for k, c in sorted(ops.items())) or "none"


def check_one(kind, backend, dtype, kv_heads, device, n, d, heads) -> dict:
    row = {"kind": kind, "backend": backend, "dtype": str(dtype).removeprefix("torch."), "kv_heads": kv_heads}
    row |= {"seq": n, "width": d, "heads": heads, "tolerance": TOLERANCE[dtype]}
    row["resolved"] = backends.resolve(backend, device, dtype, diff=kind == "diff", head_dim=d)
    q, k, v, lam = inputs(kind, n, d, heads, kv_heads, dtype, device)
    leaves = [q, k, v] + ([lam] if kind == "diff" else [])
    if backend == "flash_attn" and (dtype == torch.float32 or device.type != "cuda"):
        return row | {"status": "n/a", "note": "flash-attn runs fp16/bf16 on CUDA only"}
    try:
        out = run(kind, backend, q, k, v, lam)
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
        grads = torch.autograd.grad(out, leaves, grad_out)
        row["sdpa_ops"] = sdpa_ops(
            lambda: torch.autograd.grad(run(kind, backend, q, k, v, lam), leaves, grad_out)
        )
    except UserError as e:
        return row | {"status": "n/a", "note": str(e)}
    except Exception as e:  # noqa: BLE001 - any failure of one kernel is that check's result
        return row | {
            "status": "error",
            "note": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}",
        }
    wide = [t.detach().double().requires_grad_() for t in leaves]
    expected = reference(kind, *wide[:3], wide[3] if kind == "diff" else None)
    want = torch.autograd.grad(expected, wide, grad_out.double())
    row["out_rel_err"] = rel(out, expected)
    errors = [rel(a, b) for a, b in zip(grads[:3], want[:3])]
    if kind == "diff":
        errors.append(lambda_grad_err(grads[3], want[3], wide[:3], grad_out))
    row["grad_rel_err"] = max(errors)
    ok = row["out_rel_err"] <= TOLERANCE[dtype] and row["grad_rel_err"] <= TOLERANCE[dtype]
    return row | {"status": "pass" if ok else "FAIL", "note": ""}


def time_one(kind, backend, dtype, device, n, d, heads, rounds) -> float:
    ops = device_ops(device.type if device.type == "cpu" else str(device))
    q, k, v, lam = inputs(kind, n, d, heads, heads, dtype, device)

    def step():
        run(kind, backend, q, k, v, lam).sum().backward()

    return median_ms(ops, step, rounds)


def write_device(out: Path, device_name: str) -> None:
    """device.json: the device as named, its card (or CPU), torch and CUDA (where no earlier part wrote it)."""
    if (out / "device.json").exists():
        return
    device = torch.device(device_name)
    info = {"device": device_name, "torch": torch.__version__, "cuda": torch.version.cuda}
    if device.type == "cuda":
        info |= {
            "name": torch.cuda.get_device_name(device),
            "capability": torch.cuda.get_device_capability(device),
        }
    else:
        from ablate.hardware.device import cpu_name

        info["name"] = cpu_name()
    (out / "device.json").write_text(json.dumps(info, indent=2))


class Rows:
    """A CSV file written a row at a time, flushed after each (a part killed at its box keeps them)."""

    def __init__(self, path: Path, columns: list[str]):
        self.file = path.open("w", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=columns, extrasaction="ignore")
        self.writer.writeheader()
        self.rows: list[dict] = []

    def add(self, row: dict) -> None:
        self.rows.append(row)
        self.writer.writerow(row)
        self.file.flush()


def main(ctx) -> None:
    out, dry = ctx.out, ctx.dry
    write_device(out, ctx.device)
    device = torch.device(ctx.device)
    n, d, heads = (16, 8, 4) if dry else (256, 64, 4)
    dtypes = [torch.float32, torch.bfloat16]
    columns = ["kind", "backend", "resolved", "dtype", "kv_heads", "seq", "width", "heads", "out_rel_err",
               "grad_rel_err", "tolerance", "status", "sdpa_ops", "note"]  # fmt: skip
    checks = Rows(out / "a_kernels.csv", columns)
    for kind in KINDS:
        for backend in CHECKED:
            for dtype in dtypes:
                for kv_heads in (heads, heads // 2):
                    checks.add(check_one(kind, backend, dtype, kv_heads, device, n, d, heads))
                    print(f"[a] {kind} {backend} {checks.rows[-1]['dtype']} kv {kv_heads}: "
                          f"{checks.rows[-1]['status']}", flush=True)  # fmt: skip
    rows = checks.rows
    # The `small` scale's attention (Transformer: 12 heads of 64; Diff: 6 heads of 2 x 64), two sequences.
    timed = Rows(out / "a_timing.csv", ["kind", "backend", "dtype", "seq", "heads", "ms_fwd_bwd"])
    seq, dtype, rounds = (16, torch.float32, 1) if dry else (4096, torch.bfloat16, 10)
    for kind, h in (("softmax", 12), ("diff", 6)):
        for backend in CHECKED:
            if not any(r["kind"] == kind and r["backend"] == backend and r["status"] == "pass" for r in rows):
                continue
            try:
                ms = time_one(kind, backend, dtype, device, seq, 8 if dry else 64, h, rounds)
            except Exception as e:  # noqa: BLE001 - a timing that fails is left out, the rest go on
                print(f"[a] timing {kind} {backend}: {(str(e).splitlines() or [''])[0][:200]}", flush=True)
                continue
            timed.add({"kind": kind, "backend": backend, "dtype": str(dtype).removeprefix("torch."),
                       "seq": seq, "heads": h, "ms_fwd_bwd": round(ms, 3)})  # fmt: skip
    failed = [r for r in rows if r["status"] in ("FAIL", "error")]
    print(f"[a] {len(rows)} checks, {len(failed)} failed", flush=True)
    if failed:
        raise SystemExit(1)
