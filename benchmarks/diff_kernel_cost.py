"""Cost model of differential attention's core on a GPU, written before any GPU ran the `triton` kernel:
matmul FLOPs, exponentials and bytes moved by each way of computing Eq. 1, forward and backward, and the
throughput each predicts against the Transformer's core (SDPA's flash kernel, FlashAttention-2).

Shapes: the `small` scale's attention (recipes/table6.yaml): the Transformer has 2h = 12 heads of d = 64,
Diff h = 6 heads of sub-heads d = 64 and V 2d = 128 (the same Q, K, V sizes), one layer, bf16, 16384
tokens (batch = 16384 / N), causal, 64 x 64 tiles (a causal walk visits nb (nb + 1) / 2 of them).

Forms (per tile of one head, in units of one 64 x 64 x d product: 64 x 64 x d multiply-adds, 2 FLOPs
each; a product with V 2d wide is 2 units):
- `transformer`: SDPA flash (FA2), 2h heads: forward S, PV (2); backward S, dP, dV, dK, dQ (5).
- `split_v`: FlashDiffAttn_2 through SDPA flash (the `sdpa_flash` backend): two calls over 2h stacked
  heads with V halves, each a Transformer's core; plus the copies around them (cat of V halves, the
  addcmul of the two outputs, the final cat, and their backward).
- `flashdiff_1`: FlashDiffAttn_1 (Appendix A): one call over 2h heads with V 2d wide (a kernel that takes
  a wider V; flash-attn 2 does not): forward S (1) + PV (2), backward S 1, dP 2, dV 2, dK 1, dQ 1.
- `triton`: this project's kernel, h heads: forward S1, S2 (2) + P1 V, P2 V at 2d (4) = 6; backward in
  two kernels (the deterministic path), each recomputing S1, S2 and dP = dO V^T: kv kernel 2 + 2 + dV 2 +
  dK1, dK2 2 = 8, q kernel 2 + 2 + dQ1, dQ2 2 = 6: 20 per Diff head. The single pass: 6 + 10 = 16.

Per query-key pair, in units of heads x d FLOPs (a Diff head: two of the Transformer's): Transformer 28,
Diff single pass 32, deterministic 40. Until this count was corrected every product was booked twice
(2 units for one), so the efficiencies read from it were twice the true ones.

Time = max(matmul FLOPs / (η peak) + exponentials / MUFU, kernel bytes / (0.8 BW)) + bytes of the
elementwise passes / (0.8 BW): the flash kernels are compute bound at these lengths, FA2-style kernels do
not overlap their exponentials with the tensor cores, the copies are bandwidth bound. The same η for every
kernel, so a ratio is the model's, not a guess at tuning: an untuned Triton kernel reaching a fraction f
of FA2's efficiency moves its ratio by about f.

    python benchmarks/diff_kernel_cost.py          # the tables of benchmarks/NOTES.md
    python benchmarks/diff_kernel_cost.py --refit  # the model refitted to the H200's measured cores

`refit` redoes it from the H200 (reports/gpu-h200/): the spec-sheet model has no fixed cost, so at 1,024
and 2,048 tokens it predicted the Transformer's core at 0.44 and 0.85 ms where it took about 1.1 ms. Each
measured arm is fitted as `c0 + FLOPs / (eta x peak)` (least squares over its lengths): a fixed time per
core (launches, the backward's δ pass and dQ's float32 conversion, partial waves of a small grid) and a
matmul efficiency of its own; the next kernel (the single-pass backward: 16 units per Diff head instead of
20) is predicted with the tuned kernel's fit.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

TOKENS = 16384
HEADS, WIDTH = 6, 64  # Diff heads h and sub-head width d (the Transformer: 2h heads of d)
TILE = 64
SEQS = (1024, 2048, 4096, 8192)
ETA = 0.5  # matmul efficiency of every attention kernel (FA2 reaches 35-50% of an H100's bf16 peak)
BW_EFF = 0.8

# Spec sheets (SXM): dense bf16 tensor-core peak, HBM bandwidth, SMs x boost clock x 16 exp2 per clock.
CARDS = {
    "H100": {"tflops": 989.4, "tb_s": 3.35, "exp_t": 132 * 1.98e9 * 16 / 1e12},
    "H200": {"tflops": 989.4, "tb_s": 4.8, "exp_t": 132 * 1.98e9 * 16 / 1e12},
}
FORMS = ("transformer", "split_v", "flashdiff_1", "triton")
# The rest of a `small` layer per token, forward + backward (3x): Q, K, V, O projections (4 x 768^2),
# SwiGLU (3 x 768 x 2048) and the LM head's share (768 x 8192 / 12 layers), as GEMMs at 0.7 of peak.
REST_FLOPS_PER_TOKEN = 3 * 2 * (4 * 768 * 768 + 3 * 768 * 2048 + 768 * 8192 / 12)
GEMM_ETA = 0.7


def tiles(n: int) -> int:
    blocks = math.ceil(n / TILE)
    return blocks * (blocks + 1) // 2


def cost(form: str, n: int) -> dict[str, float]:
    """FLOPs, exponentials, kernel bytes and elementwise bytes of one layer's core, forward + backward."""
    batch = TOKENS / n
    unit = 2 * TILE * TILE * WIDTH * tiles(n) * batch  # one 64 x 64 x d product over the causal tiles
    elems = TILE * TILE * tiles(n) * batch  # score entries of one head
    e = TOKENS * 2 * HEADS * WIDTH  # elements of Q (= of K, of V, of a Transformer's O)
    if form == "transformer":
        # fwd reads Q, K, V, writes O; bwd: δ pass (O, dO), main (Q, K, V, dO in, dQ, dK, dV out), dQ's
        # float32 accumulator (zeroed, converted: 10 bytes per element).
        return {"flops": 2 * HEADS * 7 * unit, "exps": 2 * HEADS * 2 * elems, "bytes": e * (8 + 4 + 14 + 10),
                "extra": 0.0}  # fmt: skip
    if form == "split_v":
        # Two Transformer cores; per call cat(V half, V half) 3e, addcmul 3e forward, 8e backward;
        # the final cat 4e each way.
        return {"flops": 2 * 2 * HEADS * 7 * unit, "exps": 2 * 2 * HEADS * 2 * elems,
                "bytes": 2 * e * 36, "extra": e * (2 * 6 + 4 + 2 * 8 + 4)}  # fmt: skip
    if form == "flashdiff_1":
        # V repeated for the stacked heads (2e elements) and outputs 2e wide; addcmul; their backward.
        return {"flops": 2 * HEADS * 10 * unit, "exps": 2 * HEADS * 2 * elems, "bytes": e * (12 + 38),
                "extra": e * (6 + 6 + 12)}  # fmt: skip
    if form == "triton":
        # fwd reads Q, K, V, writes O and O2; bwd: δ (dO, O, O2), kv (K, V, Q, dO in, dK, dV out),
        # q (Q, dO, K, V in, dQ out).
        return {"flops": HEADS * 20 * unit, "exps": HEADS * 6 * elems, "bytes": e * (10 + 6 + 12 + 10),
                "extra": 0.0}  # fmt: skip
    raise ValueError(form)


def seconds(form: str, n: int, card: str) -> float:
    spec, c = CARDS[card], cost(form, n)
    compute = c["flops"] / (ETA * spec["tflops"] * 1e12) + c["exps"] / (spec["exp_t"] * 1e12)
    memory = c["bytes"] / (BW_EFF * spec["tb_s"] * 1e12)
    return max(compute, memory) + c["extra"] / (BW_EFF * spec["tb_s"] * 1e12)


def predict(card: str, n: int) -> dict[str, float]:
    """Throughput of each form's core relative to the Transformer's (1.0 = as fast)."""
    base = seconds("transformer", n, card)
    return {form: base / seconds(form, n, card) for form in FORMS}


def predict_model(card: str, n: int) -> dict[str, float]:
    """The same for a whole `small` training step: the rest of the layer costs every arm the same."""
    rest = TOKENS * REST_FLOPS_PER_TOKEN / (GEMM_ETA * CARDS[card]["tflops"] * 1e12)
    base = rest + seconds("transformer", n, card)
    return {form: base / (rest + seconds(form, n, card)) for form in FORMS}


def table() -> str:
    lines = ["| N | form | GFLOP | G exp | GB kernels | GB copies | " + " | ".join(
        f"{c} ms | {c} core ratio | {c} model ratio" for c in CARDS) + " |"]  # fmt: skip
    lines.append("|" + "---|" * (6 + 3 * len(CARDS)))
    for n in SEQS:
        for form in FORMS:
            c = cost(form, n)
            cells = [f"{n}", form, f"{c['flops'] / 1e9:.0f}", f"{c['exps'] / 1e9:.2f}",
                     f"{c['bytes'] / 1e9:.2f}", f"{c['extra'] / 1e9:.2f}"]  # fmt: skip
            for card in CARDS:
                cells += [f"{seconds(form, n, card) * 1e3:.2f}", f"{predict(card, n)[form]:.2f}",
                          f"{predict_model(card, n)[form]:.2f}"]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


H200_RESULTS = Path(__file__).resolve().parents[1] / "reports" / "gpu-h200"
FITTED_ARMS = {"transformer_sdpa_flash": "transformer", "diff_split_v_sdpa_flash": "split_v",
               "diff_triton": "triton", "diff_triton_128x64": "triton"}  # fmt: skip
SINGLE_PASS_UNITS = 6 + 10  # forward 6; backward: S1, S2, dP, dV, dK1, dK2 (8) and dQ1, dQ2 (2) in one walk


def measured_cores(folder: Path = H200_RESULTS) -> dict[str, dict[int, float]]:
    """arm -> {N: ms of one layer's core, forward + backward}: part t's rerun (64 x 64 tiles for the
    kernel) and the tuned launch (128 x 64, 8 warps, 2 stages) from tune_triton.csv."""
    arms: dict[str, dict[int, float]] = {}
    with (folder / "rerun" / "t_bench.csv").open() as f:
        for r in csv.DictReader(f):
            if r["arm"] in FITTED_ARMS and r["ms_fwd_bwd"]:
                arms.setdefault(r["arm"], {})[int(r["seq"])] = float(r["ms_fwd_bwd"])
    with (folder / "tune_triton.csv").open() as f:
        for r in csv.DictReader(f):
            if (r["arm"], r["block_m"], r["block_n"], r["num_warps"], r["num_stages"]) == (
                "diff_triton",
                "128",
                "64",
                "8",
                "2",
            ):
                arms.setdefault("diff_triton_128x64", {})[int(r["seq"])] = float(r["ms_fwd_bwd"])  # fmt: skip
    return arms


def fit(points: dict[int, float], form: str) -> tuple[float, float]:
    """(c0 ms, eta): least squares of ms = c0 + GFLOP x slope over the measured lengths."""
    xs = [cost(form, n)["flops"] / 1e9 for n in points]
    ys = list(points.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, 1e12 / slope / (CARDS["H200"]["tflops"] * 1e12)  # slope: ms per GFLOP


def refit() -> str:
    arms = measured_cores()
    fits = {arm: fit(points, FITTED_ARMS[arm]) for arm, points in arms.items()}
    peak = CARDS["H200"]["tflops"] * 1e12
    lines = ["| arm | c0 ms | eta |", "|---|---|---|"]
    lines += [f"| {arm} | {c0:.2f} | {eta:.2f} |" for arm, (c0, eta) in fits.items()]
    lines += ["", "| N | arm | measured ms | spec model ms | refit ms | measured ratio | refit ratio |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    base = arms["transformer_sdpa_flash"]
    for n in SEQS:
        for arm, points in arms.items():
            if n not in points:
                continue
            form, (c0, eta) = FITTED_ARMS[arm], fits[arm]
            refitted = c0 + cost(form, n)["flops"] / (eta * peak) * 1e3
            c0t, etat = fits["transformer_sdpa_flash"]
            base_refit = c0t + cost("transformer", n)["flops"] / (etat * peak) * 1e3
            lines.append(f"| {n} | {arm} | {points[n]:.3f} | {seconds(form, n, 'H200') * 1e3:.2f} | {refitted:.2f} | "
                         f"{base[n] / points[n]:.3f} | {base_refit / refitted:.3f} |")  # fmt: skip
        c0, eta = fits["diff_triton_128x64"]
        single = c0 + cost("triton", n)["flops"] * SINGLE_PASS_UNITS / 20 / (eta * peak) * 1e3
        lines.append(f"| {n} | next kernel (single-pass backward), predicted | | | {single:.2f} | | "
                     f"{base[n] / single:.3f} (against the measured Transformer) |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(refit() if "--refit" in sys.argv else table())
