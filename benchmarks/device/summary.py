"""The device check's README.md: the card, the commands, each part's status and headline numbers, and what
each number means, from whatever the parts wrote (stdlib only: it runs before anything is installed)."""

from __future__ import annotations

import csv
import json
import re
import statistics
import time
from pathlib import Path

from csv_rows import replace_text, write_rows  # benchmarks/device/csv_rows.py: stdlib

MEANINGS = """\
## What each number means

- `a_kernels.csv`: per attention kind (softmax, diff), backend, dtype and kv-head count (all heads, or
  half: grouped-query attention), the relative Frobenius error `|x - x64| / |x64|` of the output and the
  largest over the gradients (q, k, v and, for diff, λ) against float64 formulas written in
  `benchmarks/device/backend_check.py`, on random inputs (2 sequences of `seq`, heads `width` wide; diff's V is
  2 x `width`). Tolerance: 2e-4 in float32, 3e-2 in bfloat16 (inputs rounded to bf16 first, so the
  reference sees the same numbers). `resolved`: the core `auto` (or the name) runs there; `sdpa_ops`: the
  SDPA operators that ran, which name the fused kernel (flash, efficient, cudnn, or the CPU's flash
  kernel); `n/a`: the backend has no kernel for that device or dtype (the note says why).
- `a_timing.csv`: median milliseconds of one forward + backward of the attention core alone at the
  `small` scale's heads (Transformer 12 x 64, Diff 6 x 2 x 64), 2 sequences.
- `b_bench/`: `ablate bench` (its `bench.md` explains every column): training tokens/s (forward,
  backward, AdamW), peak memory above the weights and optimizer state, and `mfu` against the card's matmul
  peak measured in the same run (bf16 square GEMMs: an H100's reach about 600-700 of its 989 spec
  TFLOP/s); `mfu_spec` in the table above (`b_bench/mfu_spec.csv`) is the same FLOPs against the card's
  dense bf16 spec peak (`SPEC_TFLOPS`), the figure papers usually quote.
- `c_train.csv`, `e_compile.csv`: the training curves of parts c and e as MLflow logged them: train/loss
  every 10 steps, val/loss at the end (on as many of 8 batches as the validation split holds, part e on
  2), tokens/s of the interval without the time spent compiling, and `compile_s`, the seconds spent in
  torch.compile so far (part e); `attention_choice` and `attention_timings_ms`: the attention `auto`
  measured on CUDA and every candidate's milliseconds per step (ablate/train/choices/attention.py).
  The tables above: first and last logged training loss, last validation loss, median tokens/s of the
  intervals, the last `compile_s`.
- `d_budgets.csv`: part d's validation loss, AR-Hit and Others at every token budget per variant and seed
  (the budgets below the largest are cooldowns branched off the longest run), and each run's seconds.
  Its budgets were sized to land in its box (`logs/d_budgets.log` says which, from an assumed rate that
  these seconds correct); a run still RUNNING there was stopped at the box.
- `w_paths.csv`, `x_paths.csv`: parts w (eager) and x (`torch.compile`): per path (the attention backend
  `auto` resolves to, `sdpa_cudnn`, `triton`) one `ablate bench` of the `small` Transformer and Diff at
  2,048 tokens a sequence, 16,384 a step, median of 2 interleaved rounds (`w_paths/<path>/bench.md`,
  `x_paths/<path>/bench.md`): training tokens/s, Diff's over the Transformer's on the same path, and over
  the Transformer's fastest path measured before it (each arm on its fastest path: the figure that
  counts). A path that failed is one row, its reason in `note`.
- `p_steps.csv`, `p_profile.csv`: part p, one training step per arm (the `small` model, 2,048 x 8, the
  recipe's backend, eager) under `torch.profiler` after 3 warm-up steps: the step's milliseconds (wall,
  synchronized), the sum of every kernel's own device time, the number of kernel launches; then the top
  25 kernels by own device time, with their share of the step (of its wall time: what is not covered is
  the device idle, waiting on launches) and of the kernels' sum.
- `m_memory.csv`: part m, the memory plan (ablate/model/memory.py, one rank of FSDP2) beside what the
  `small` Transformer, Diff and Diff with each block recomputed held under `fully_shard` (per block and at
  the root) after 3 AdamW steps of one 1,024 x 16 micro-batch, bf16 on CUDA: the model state planned and
  measured (every local shard, gradient and AdamW state tensor; they should be equal), the plan's total
  and the last step's peak (`torch.cuda.max_memory_allocated`), and their ratio.
- `parts.csv`: each part's status and seconds, appended as each part ends (and across runs into the same
  folder); `versions.json`: what the image had of each needed package against pyproject's bounds, before
  and after the install; `logs/`: each part's output; `stores/`: the MLflow and Optuna stores, copied after
  every part (`ablate report` and `ablate ui` read them on a machine with the full install).
"""


def read_csv(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


def table(rows: list[dict], columns: list[str]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows]


def kernels_section(out: Path) -> list[str]:
    rows = read_csv(out / "a_kernels.csv")
    if not rows:
        return ["(no results)"]
    counts = {s: sum(r["status"] == s for r in rows) for s in ("pass", "FAIL", "error", "n/a")}
    lines = [", ".join(f"{n} {s}" for s, n in counts.items()) + f" of {len(rows)} checks.", ""]
    auto = [r for r in rows if r["backend"] == "auto" and r["kv_heads"] == rows[0]["kv_heads"]]
    lines += ["`auto` runs: " + "; ".join(f"{r['kind']} {r['dtype']} -> {r['resolved']}" for r in auto), ""]
    bad = [r for r in rows if r["status"] in ("FAIL", "error")]
    if bad:
        lines += table(
            bad, ["kind", "backend", "dtype", "kv_heads", "out_rel_err", "grad_rel_err", "note"]
        ) + [""]
    timing = read_csv(out / "a_timing.csv")
    return lines + (
        table(timing, ["kind", "backend", "dtype", "seq", "heads", "ms_fwd_bwd"]) if timing else []
    )


# Dense bf16 tensor-core peaks (TFLOP/s, NVIDIA's data sheets), by a part of the name torch reports; the
# first match counts, so the PCIe and NVL H100s come before the SXM one.
SPEC_TFLOPS = [("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("GH200", 989.4), ("H200", 989.4),
               ("H100", 989.4), ("A100", 312.0), ("L40S", 362.1), ("B200", 2250.0)]  # fmt: skip


def spec_tflops(card: str) -> float | None:
    return next((tflops for part, tflops in SPEC_TFLOPS if part in card), None)


def bench_rows(out: Path, card: str) -> list[dict]:
    """bench.csv with `mfu_spec`: the same FLOPs against the card's spec peak, from the measured bf16 peak
    that bench.md states (mfu x measured / spec)."""
    rows = read_csv(out / "b_bench" / "bench.csv")
    md = out / "b_bench" / "bench.md"
    text = md.read_text() if md.exists() else ""
    ran = re.search(r"MFU is against the (\S+) peak", text)
    peaks = dict((d, float(p)) for d, p in re.findall(r"(\w+) ([\d.]+) TFLOP/s", text))
    spec = spec_tflops(card)
    measured = peaks.get(ran.group(1)) if ran and ran.group(1) == "bf16" else None
    for r in rows:
        try:
            r["mfu_spec"] = f"{float(r['mfu']) * measured / spec:.4f}" if spec and measured else ""
        except ValueError:  # an mfu of "nan" (the measured peak suspect)
            r["mfu_spec"] = ""
    return rows


def train_section(out: Path, name: str) -> list[str]:
    rows = read_csv(out / name)
    summary = []
    for variant in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == variant]
        losses = [(int(r["step"]), float(r["train/loss"])) for r in mine if r.get("train/loss")]
        vals = [float(r["val/loss"]) for r in mine if r.get("val/loss")]
        rates = [float(r["tokens_per_s"]) for r in mine if r.get("tokens_per_s")]
        if not losses:
            continue
        summary.append({
            "variant": variant, "steps": losses[-1][0], "first train loss": f"{losses[0][1]:.3f}",
            "last train loss": f"{losses[-1][1]:.3f}", "last val loss": f"{vals[-1]:.3f}" if vals else "",
            "median tokens/s": f"{statistics.median(rates):,.0f}" if rates else "",
            "loss falling": "yes" if losses[-1][1] < losses[0][1] else "NO",
        })  # fmt: skip
        compiling = [float(r["compile_s"]) for r in mine if r.get("compile_s")]
        if compiling:
            summary[-1]["compile s"] = f"{compiling[-1]:.0f}"
    return table(summary, list(summary[0])) if summary else ["(no results)"]


def budgets_section(out: Path) -> list[str]:
    rows = [r for r in read_csv(out / "d_budgets.csv") if r["val_loss"] and r["status"] == "FINISHED"]
    cells: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        cells.setdefault((r["variant"], r["budget_tokens"]), []).append(float(r["val_loss"]))
    summary = [
        {"variant": v, "budget tokens": b, "seeds": len(x), "mean val loss": f"{statistics.mean(x):.4f}"}
        for (v, b), x in cells.items()
    ]
    return table(summary, list(summary[0])) if summary else ["(no finished budget)"]


def paths_section(out: Path) -> list[str]:
    """Parts w and x: each path's training tokens/s per arm and Diff's ratios (`paths.py`)."""
    rows = read_csv(out / "w_paths.csv") + read_csv(out / "x_paths.csv")
    columns = ["path", "variant", "train_tok_s", "diff_over_transformer", "diff_over_fastest_transformer",
               "status", "note"]  # fmt: skip
    return table(rows, columns) if rows else ["(no results)"]


def profile_section(out: Path, top: int = 8) -> list[str]:
    """Part p: each arm's profiled step and its top kernels (`profile_step.py`)."""
    steps = read_csv(out / "p_steps.csv")
    if not steps:
        return ["(no results)"]
    kernels = [r for r in read_csv(out / "p_profile.csv") if int(r["rank"]) <= top]
    return [*table(steps, list(steps[0])), "", *table(kernels, list(kernels[0]) if kernels else ["variant"])]


def memory_section(out: Path) -> list[str]:
    """Part m: each row's plan beside its measured state and peak (`memory_fsdp.py`)."""
    rows = read_csv(out / "m_memory.csv")
    columns = ["variant", "activation_checkpointing", "precision", "planned_state", "measured_state",
               "planned_total", "measured_peak", "peak_over_plan"]  # fmt: skip
    return table(rows, columns) if rows else ["(no results)"]


def write_readme(out: Path, args, argv: list[str]) -> None:
    """README.md from what is in `out`, parts.csv's rows included (every run into the folder)."""
    info = json.loads((out / "device.json").read_text()) if (out / "device.json").exists() else {}
    card = info.get("name", args.device)
    parts = read_csv(out / "parts.csv")
    bench = bench_rows(out, card)
    if bench:  # the table below quotes mfu_spec: it is kept in a CSV beside bench.csv
        write_rows(out / "b_bench" / "mfu_spec.csv", bench, ["variant", "seq_len", "mfu", "mfu_spec"])
    ran = {row["part"] for row in parts}

    def section(part: str, lines: list[str]) -> list[str]:
        return lines if part in ran else ["(not run)"]

    lines = [
        f"# Device check: {card}",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; torch `{info.get('torch', '?')}`, CUDA "
        f"`{info.get('cuda') or '-'}`; device `{args.device}`{' (dry run: tiny sizes)' if args.dry else ''}.",
        "",
        "```",
        "python benchmarks/device/wheels.py      # beforehand, on a machine with a package index",
        "python "
        + " ".join(Path(a).name if i == 0 else a for i, a in enumerate(argv)).replace(
            "check.py", "benchmarks/device/check.py", 1
        ),
        "```",
        "",
        "## Parts",
        "",
        *table(parts, ["part", "status", "seconds", "limit_s", "note"]),
        "",
        "## (a) attention kernels against float64",
        "",
        *section("a", kernels_section(out)),
        "",
        "## (b) `ablate bench`",
        "",
        *section("b", table(bench, list(bench[0])) if bench else ["(no results)"]),
        "",
        "## (c) `ablate train`: Transformer and Diff",
        "",
        *section("c", train_section(out, "c_train.csv")),
        "",
        "## (e) `ablate train` with `train.compile: true`: Diff",
        "",
        *section("e", train_section(out, "e_compile.csv")),
        "",
        "## (w, x) the whole `small` model on each path: eager and compiled",
        "",
        *(paths_section(out) if ran & {"w", "x"} else ["(not run)"]),
        "",
        "## (p) one profiled training step per arm",
        "",
        *section("p", profile_section(out)),
        "",
        "## (m) the memory plan beside the measured peak, FSDP2 on one device",
        "",
        *section("m", memory_section(out)),
        "",
        "## (d) token budgets at the `cpu-tokens` width, sized to the box",
        "",
        *section("d", budgets_section(out)),
        "",
        MEANINGS,
    ]
    replace_text(out / "README.md", "\n".join(lines))
