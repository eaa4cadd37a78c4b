"""What `ablate bench` writes from its measured arms (ablate.bench.measure): `bench.csv`, `bench.md`,
`ratios.csv` and `bench.png`; the MFU of each arm, and each variant's ratios to the first beside its FLOP
ceilings (ablate.bench.ceilings)."""

from __future__ import annotations

import importlib.util
import math
import statistics
from pathlib import Path
from typing import Any

import torch

from ablate.bench.ceilings import flop_ceilings
from ablate.bench.measure import DISTURBED, Arm
from ablate.core.tables import markdown_table
from ablate.model.config import ModelConfig
from ablate.model.decoder import attention_kernel

COLUMNS = ("variant", "seq_len", "train_tok_s", "fwd_tok_s", "peak_mem_mb", "mfu")
PEAK_SUSPECT = "n/a (peak suspect)"


def write_results(
    folder: Path, arms: list[Arm], configs: dict[str, ModelConfig], models: dict, context: dict
) -> str:
    """bench.csv, bench.md, ratios.csv and bench.png (where matplotlib is installed) into `folder`;
    returns bench.md's text. `context`: what the tables say about the run (recipe, scale, step, precision,
    peaks, device, rounds, compile, loads, malloc, foreign share, retakes)."""
    variants, ops, dtypes = list(configs), context["ops"], context["dtypes"]
    seq_lens = list(dict.fromkeys(a.seq_len for a in arms))
    folder.mkdir(parents=True, exist_ok=True)
    rows = _rows(arms, context["peaks"][dtypes[0]])
    _write_csv(rows, folder / "bench.csv")
    ceilings = {
        v: {n: flop_ceilings(configs[variants[0]], configs[v], n) for n in seq_lens} for v in variants[1:]
    }
    kernel_at = {
        (a.variant, a.seq_len): attention_kernel(models[a.variant][0], ops.device, dtypes[0], a.seq_len)
        for a in arms
    }
    text = _markdown(
        context["recipe"],
        context["scale"],
        context["step"],
        rows,
        (context["precision"], context["why"], dtypes[0]),
        context["peaks"],
        ceilings,
        {v: _kernels_by_length(v, kernel_at) for v in variants},
        (ops.describe(), context["rounds"], context["compile"]),
        context["loads"],
        context["malloc"],
        (context["foreign"], context["repeated"]),
    )
    (folder / "bench.md").write_text(text)
    _write_rows(ratios(rows, variants, kernel_at, ceilings), folder / "ratios.csv")
    if importlib.util.find_spec("matplotlib") is not None:
        _plot(rows, variants, ceilings, folder / "bench.png")
    else:  # a GPU image without it (benchmarks/device): the tables are the results, the figure is not
        context["say"]("bench.png not drawn: matplotlib is not installed")
    return text


def model_flop_utilization(achieved: float, peak: float) -> float:
    """achieved / peak FLOP/s; NaN where the measured peak is below what the model itself achieved: such
    a peak is not the device's (a disturbed or too short measurement), and an MFU over 100% would
    mislead."""
    return achieved / peak if peak >= achieved else float("nan")


def _rows(arms: list[Arm], peak: float) -> list[dict[str, Any]]:
    rows = []
    for arm in arms:
        train = arm.n_tokens / statistics.median(arm.train_s)
        fwd = arm.n_tokens / statistics.median(arm.fwd_s)
        rows.append(
            {
                "variant": arm.variant,
                "seq_len": arm.seq_len,
                "batch": arm.step.tokens.shape[0],
                "train_tok_s": train,
                "fwd_tok_s": fwd,
                "peak_mem_mb": arm.peak_bytes / 2**20,
                "mfu": model_flop_utilization(3 * arm.flops_per_token * train, peak),
                "train_range": (arm.n_tokens / max(arm.train_s), arm.n_tokens / min(arm.train_s)),
                "opt_share": statistics.median(arm.opt_s) / statistics.median(arm.train_s),
            }
        )
    return rows


def _kernels_by_length(variant: str, kernel_at: dict[tuple[str, int], str]) -> str:
    """The kernel `variant` ran, or where `auto` chose by length, each kernel with its lengths."""
    lengths: dict[str, list[int]] = {}
    for (v, n), kernel in sorted(kernel_at.items()):
        if v == variant:
            lengths.setdefault(kernel, []).append(n)
    if len(lengths) == 1:
        return next(iter(lengths))
    return "; ".join(f"{k} at {', '.join(map(str, ns))}" for k, ns in lengths.items())


def ratios(
    rows: list[dict[str, Any]],
    variants: list[str],
    kernels: dict[Any, str],
    ceilings: dict[str, dict[int, dict[str, tuple[float, float]]]] | None = None,
) -> list[dict[str, Any]]:
    """ratios.csv: per variant after the first and sequence length, its training, forward and peak-memory
    ratios to the first variant (the reference) at the kernel each used (`kernels` keyed by variant or by
    (variant, seq_len)), and the FLOP ceilings."""
    by = {(r["variant"], r["seq_len"]): r for r in rows}
    out = []
    for variant in variants[1:]:
        for n in sorted({r["seq_len"] for r in rows if r["variant"] == variant}):
            mine, ref = by[(variant, n)], by.get((variants[0], n))
            if ref is None:
                continue
            row = {
                "variant": variant,
                "reference": variants[0],
                "seq_len": n,
                "kernel": kernels.get((variant, n), kernels.get(variant, "")),
                "reference_kernel": kernels.get((variants[0], n), kernels.get(variants[0], "")),
                "train_ratio": round(mine["train_tok_s"] / ref["train_tok_s"], 4),
                "fwd_ratio": round(mine["fwd_tok_s"] / ref["fwd_tok_s"], 4),
                "peak_mem_ratio": round(mine["peak_mem_mb"] / ref["peak_mem_mb"], 4),
            }
            for form, (dense, causal) in ((ceilings or {}).get(variant, {}).get(n, {})).items():
                row[f"ceiling_dense: {form}"], row[f"ceiling_causal: {form}"] = (
                    round(dense, 4),
                    round(causal, 4),
                )
            out.append(row)
    return out


def _write_rows(rows: list[dict[str, Any]], path: Path) -> None:
    import csv

    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)) or ["variant"])
        writer.writeheader()
        writer.writerows(rows)


def _write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    lines = [",".join(COLUMNS)]
    for r in rows:
        lines.append(
            f"{r['variant']},{r['seq_len']},{r['train_tok_s']:.2f},{r['fwd_tok_s']:.2f},"
            f"{r['peak_mem_mb']:.1f},{r['mfu']:.4f}"
        )
    path.write_text("\n".join(lines) + "\n")


def _markdown(
    recipe, scale, batch, rows, chosen, peaks, ceilings, backends_used, run, loads, malloc, foreign
) -> str:
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    (precision, why, ran), (where, rounds, compiled) = chosen, run
    lines = [
        f"# ablate bench: {recipe}, scale {scale}",
        "",
        f"{where}, torch {torch.__version__}; {batch}; precision {precision} ({why}); "
        f"median of {rounds} interleaved rounds{'; torch.compile' if compiled else ''}; {malloc}. "
        f"Load average before {loads[0][0]:.2f}, after {loads[1][0]:.2f} (1 min, this run included); "
        f"other processes used {foreign[0]:.1%} of the machine's CPU during the run; {foreign[1]} "
        f"timings taken again because others used more than {DISTURBED:.0%} of it meanwhile.",
        "",
        "Matmul peak (square GEMMs, best of the run): "
        + ", ".join(f"{_dtype_name(d)} {p / 1e12:.3f} TFLOP/s" for d, p in peaks.items())
        + f"; MFU is against the {_dtype_name(ran)} peak.",
        "Attention kernel per variant: " + ", ".join(f"{v} `{b}`" for v, b in backends_used.items()) + ".",
        "",
        _throughput_table(rows),
    ]
    for variant in variants[1:]:
        lines += _ratio_section(rows, variant, variants[0], ceilings[variant])
    lines += ["", COLUMNS_NOTE]
    return "\n".join(lines) + "\n"


COLUMNS_NOTE = (
    "Columns: training = forward + backward + AdamW (fused) step, the AdamW share of its time given "
    "(training proper amortises it over gradient accumulation); fwd = forward without grad; peak MB = "
    "peak growth of PyTorch's allocator on the device during a training step (activations, gradients, "
    "temporaries; parameters and optimizer state excluded); MFU = budget FLOPs x 3 x train tok/s / "
    f"matmul peak of the dtype that ran, maps counted dense; {PEAK_SUSPECT}: the measured peak was "
    "below the model's own FLOP rate, so it is not the device's peak."
)


def _throughput_table(rows: list[dict[str, Any]]) -> str:
    """Every arm's throughputs, memory and MFU."""
    return markdown_table(
        [
            "variant",
            "seq_len",
            "batch",
            "train tok/s",
            "(min-max)",
            "of which AdamW",
            "fwd tok/s",
            "peak MB",
            "MFU",
        ],
        [
            [
                r["variant"],
                r["seq_len"],
                r["batch"],
                f"{r['train_tok_s']:.0f}",
                "{:.0f}-{:.0f}".format(*r["train_range"]),
                f"{r['opt_share']:.1%}",
                f"{r['fwd_tok_s']:.0f}",
                f"{r['peak_mem_mb']:.0f}",
                PEAK_SUSPECT if math.isnan(r["mfu"]) else f"{r['mfu']:.1%}",
            ]
            for r in rows
        ],
        align="llrrrrrrr",
    )


def _ratio_section(
    rows: list[dict[str, Any]],
    variant: str,
    reference: str,
    ceilings: dict[int, dict[str, tuple[float, float]]],
) -> list[str]:
    """`variant`'s ratios to `reference` at each length, beside its FLOP ceilings (dense, causal)."""
    by = {(r["variant"], r["seq_len"]): r for r in rows}
    seq_lens = list(dict.fromkeys(r["seq_len"] for r in rows))
    forms = list(ceilings[seq_lens[0]])
    headers = ["seq_len", "train", "fwd", "peak mem"] + [f"ceiling: {f}" for f in forms]
    table = []
    for n in seq_lens:
        a, b = by[(variant, n)], by[(reference, n)]
        table.append(
            [
                n,
                f"{a['train_tok_s'] / b['train_tok_s']:.3f}",
                f"{a['fwd_tok_s'] / b['fwd_tok_s']:.3f}",
                f"{a['peak_mem_mb'] / b['peak_mem_mb']:.3f}",
            ]
            + [f"{d:.3f} ({c:.3f})" for d, c in (ceilings[n][f] for f in forms)]
        )
    return [
        "",
        f"## {variant} / {reference}",
        "",
        markdown_table(headers, table, align="r" * len(headers)),
        "",
        "Ceilings: the throughput ratio if time were proportional to the FLOPs of the whole model under "
        "each kernel form, maps counted dense (in brackets: causal, the masked half skipped).",
    ]


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "float32"}.get(dtype, str(dtype))


def _plot(
    rows: list[dict[str, Any]],
    variants: list[str],
    ceilings: dict[str, dict[int, dict[str, tuple[float, float]]]],
    path: Path,
) -> Path:
    """Throughputs and memory per variant, and each variant's training ratio to the first beside its
    FLOP ceilings (dense). Every axis starts at zero; a single sequence length draws markers, not lines."""
    from ablate.core import plot_style

    fig, axes = plot_style.figure_grid(4, 16, 3.9)
    colors = plot_style.variant_colors(variants)
    panels = [
        ("train_tok_s", "training throughput (tokens/s)"),
        ("fwd_tok_s", "forward throughput (tokens/s)"),
        ("peak_mem_mb", "peak memory growth in a step (MB)"),
    ]
    series = {v: sorted((r["seq_len"], r) for r in rows if r["variant"] == v) for v in variants}
    for i, (key, label) in enumerate(panels):
        ax = axes[i]
        for variant in variants:
            xs = [n for n, _ in series[variant]]
            plot_style.series(
                ax, xs, [r[key] for _, r in series[variant]], label=variant, color=colors[variant]
            )
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.1 * max(r[key] for r in rows))  # from zero: a 3% difference should look like one
        plot_style.finish(ax, title=label, xlabel="sequence length (tokens)", ylabel=label, legend=i == 0)
    ax = axes[3]
    reference = dict(series[variants[0]])
    top = 1.0
    for variant in variants[1:]:
        lens = [n for n, _ in series[variant]]
        ratio = [r["train_tok_s"] / reference[n]["train_tok_s"] for n, r in series[variant]]
        plot_style.series(
            ax, lens, ratio, label=f"{variant} / {variants[0]} (training)", color=colors[variant]
        )
        for j, form in enumerate(ceilings[variant][lens[0]]):
            values = [ceilings[variant][n][form][0] for n in lens]
            plot_style.series(
                ax, lens, values, label=f"ceiling: {form}", color=f"0.{3 + 2 * j}", linestyle="--", marker="x"
            )
            top = max(top, *values)
        top = max(top, *ratio)
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.1 * top)  # from zero, as the other panels
    plot_style.finish(
        ax,
        title="training throughput ratio to the first variant",
        xlabel="sequence length (tokens)",
        ylabel="throughput ratio",
    )
    ax.legend(fontsize=6, frameon=False)
    return plot_style.save(fig, path)
