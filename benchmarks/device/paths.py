"""Parts (w) and (x) of the device check: the whole `small` model, Transformer and Diff, on each path a
run could take: the attention backend `auto` resolves to, cuDNN (`sdpa_cudnn`) and the fused kernel
(`triton`), eager (w) and under `torch.compile` (x).

Each path is one `ablate bench` (the recipe's `small` scale, one sequence length, 16,384 tokens a step,
interleaved rounds) in its own process, so a path that fails (a backend without a kernel on the card, a
compile that breaks) is a row saying so and the next path still runs. As each path ends its rows are
appended to `w_paths.csv` / `x_paths.csv`: training tokens/s per arm, Diff's against the Transformer's on
the same path, and Diff's against the Transformer's fastest path so far (the figure that counts: each arm
on its fastest path). Each path's own `bench.md` stays in `w_paths/<path>/`.
"""

from __future__ import annotations

import csv
import time
from pathlib import Path

from csv_rows import append_rows  # benchmarks/device/csv_rows.py
from runs import cli  # benchmarks/device/runs.py

BACKENDS = ("auto", "sdpa_cudnn", "triton")
# A dry run on a CPU: the backend without a CPU kernel first (its row records the refusal, and the next
# path still runs), then `auto`; the `triton` path there is Triton's interpreter, a minute a path (part t
# checks the kernel under it).
DRY_BACKENDS = ("sdpa_cudnn", "auto")
COLUMNS = ["path", "backend", "compiled", "variant", "seq_len", "train_tok_s", "diff_over_transformer",
           "diff_over_fastest_transformer", "status", "seconds", "note"]  # fmt: skip
SEQ_LEN = 2048
TOKENS = 16384
ROUNDS = 2


def bench_args(recipe: Path, dry: bool) -> list[str]:
    """One path's `ablate bench` options beside `--backend`, `--compile` and `--out`."""
    if dry:
        return [str(recipe), "--scale", "train-small", "--seq-lens", "16", "--rounds", "1",
                "--tokens-per-step", "64", "--peak-budget-s", "0.2", "--peak-max-size", "128"]  # fmt: skip
    return ["recipes/table6.yaml", "--scale", "small", "--seq-lens", str(SEQ_LEN), "--rounds", str(ROUNDS),
            "--tokens-per-step", str(TOKENS), "--peak-budget-s", "1"]  # fmt: skip


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


def path_rows(name: str, backend: str, compiled: bool, bench_csv: Path, status: str, seconds: float,
              fastest_transformer: float | None, note: str = "") -> list[dict]:  # fmt: skip
    """The rows of one path: each arm's tokens/s, and Diff's ratios (on this path; against the fastest
    Transformer measured so far, this path included); a path without results is one row with `note`."""
    common = {"path": name, "backend": backend, "compiled": compiled, "seconds": round(seconds, 1)}
    bench = read_rows(bench_csv) if status == "ok" else []
    if not bench:
        return [{**common, "status": status, "note": note}]
    rates = {r["variant"]: float(r["train_tok_s"]) for r in bench}
    if "transformer" in rates:
        fastest_transformer = max(fastest_transformer or 0.0, rates["transformer"])
    rows = []
    for r in bench:
        row = {**common, "variant": r["variant"], "seq_len": r["seq_len"], "train_tok_s": r["train_tok_s"],
               "status": status}  # fmt: skip
        if r["variant"] == "diff" and "transformer" in rates:
            row["diff_over_transformer"] = f"{rates['diff'] / rates['transformer']:.3f}"
        if r["variant"] == "diff" and fastest_transformer:
            row["diff_over_fastest_transformer"] = f"{rates['diff'] / fastest_transformer:.3f}"
        rows.append(row)
    return rows


def fastest_transformer(out: Path) -> float | None:
    """The Transformer's fastest training tokens/s in w_paths.csv and x_paths.csv so far."""
    rates = [float(r["train_tok_s"]) for name in ("w_paths.csv", "x_paths.csv")
             for r in read_rows(out / name) if r["variant"] == "transformer" and r["train_tok_s"]]  # fmt: skip
    return max(rates) if rates else None


def last_line(log: Path) -> str:
    """The log's last line (a failed `ablate bench`'s one-line reason, or its traceback's last line)."""
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else ""


def run_paths(ctx, compiled: bool) -> None:
    part = "x" if compiled else "w"
    log = ctx.out / "logs" / f"{part}_paths.log"
    for backend in DRY_BACKENDS if ctx.dry else BACKENDS:
        name = f"{'compiled' if compiled else 'eager'}-{backend}"
        folder = ctx.out / f"{part}_paths" / name
        started = time.monotonic()
        code = cli("bench", *bench_args(ctx.recipe, ctx.dry), "--backend", backend, "--compile",
                   str(compiled).lower(), "--device", ctx.device, "--out", str(folder), log=log, check=False)  # fmt: skip
        status = "ok" if code == 0 else f"failed (exit {code})"
        rows = path_rows(name, backend, compiled, folder / "bench.csv", status, time.monotonic() - started,
                         fastest_transformer(ctx.out), "" if code == 0 else last_line(log))  # fmt: skip
        append_rows(ctx.out / f"{part}_paths.csv", rows, COLUMNS)


def eager(ctx) -> None:
    """(w) both arms, eager, on each backend."""
    run_paths(ctx, compiled=False)


def compiled(ctx) -> None:
    """(x) both arms under torch.compile, on each backend (a cold compile of each model: its first step)."""
    run_paths(ctx, compiled=True)
