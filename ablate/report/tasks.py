"""The report of a sweep whose data is a task: Table 2-, Table 3- and Figure 5-style outputs.

Reads the finished runs' final metrics from MLflow (what `ablate.train.records` logged for a task); never builds a
model. Writes into the sweep's report folder, beside `table.md`:

- `task_accuracy.md` / `.csv`: exact-match accuracy per level (the cells' first tag: `level` for
  multi_needle, `pairs` for mqar) and over all levels, mean over seeds [95% Student-t interval], and the
  difference to the first row paired by seed, with its interval (Table 2).
- `task_attention.md` / `.csv`: attention share on the answer needle's span and on the rest of the context, per
  depth, mean over seeds [95% interval] (Table 3; definition in `ablate.analysis.attention_shares`).
- `heatmap_<variant>.png`: accuracy per depth x context length, one panel per level, mean over seeds
  (Figure 5).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ablate.core.tables import markdown_table
from ablate.report import stats
from ablate.report.table import write_csv

if TYPE_CHECKING:
    from ablate.store.study import SweepContext

CELL_PREFIX = "val/accuracy_cell/"


def is_task_recipe(ctx: SweepContext) -> bool:
    """True when the sweep's runs read a task (`data.task`) rather than a corpus."""
    return any(run.data.task is not None for run in ctx.runs.values())


def _split(part: str) -> tuple[str, str]:
    key, _, value = part.partition("_")
    return key, value


def _sort_key(value: str) -> tuple:
    numbers = [int(n) for n in re.findall(r"\d+", value)]
    return (numbers, value)


def run_metrics(ctx: SweepContext, records: list[Any]) -> dict[tuple[str, int], dict[str, float]]:
    """(variant, seed) -> final metrics of every finished run."""
    client = ctx.stores.client()
    out = {}
    for r in records:
        if r.state == "finished" and r.run_id:
            out[(r.variant, r.seed)] = dict(client.get_run(r.run_id).data.metrics)
    return out


def _cells(metrics: dict[tuple[str, int], dict[str, float]]) -> list[dict[str, str]]:
    seen: dict[str, dict[str, str]] = {}
    for m in metrics.values():
        for name in m:
            if name.startswith(CELL_PREFIX):
                seen[name] = dict(_split(p) for p in name[len(CELL_PREFIX) :].split("/"))
    return list(seen.values())


def _values(metrics: dict[tuple[str, int], dict[str, float]], variant: str, name: str) -> dict[int, float]:
    return {seed: m.get(name, math.nan) for (v, seed), m in metrics.items() if v == variant}


def accuracy_table(
    order: list[str],
    labels: dict[str, str],
    metrics: dict[tuple[str, int], dict[str, float]],
    paper: dict[str, dict[str, float]] | None = None,
) -> tuple[str, list[dict[str, Any]]]:
    """Table 2: Markdown (accuracy per level, then the paired differences to the first row) and CSV rows.
    `paper` (variant -> {level: accuracy}, the recipe's `paper:` entries) adds the paper's numbers."""
    cells = _cells(metrics)
    level_key = next(iter(cells[0])) if cells else None
    levels = sorted({c[level_key] for c in cells}, key=_sort_key) if level_key else []
    columns = [(f"{level_key} {lv}", f"val/accuracy/{level_key}_{lv}") for lv in levels] + [
        ("all", "val/accuracy")
    ]
    present = [v for v in order if any(k[0] == v for k in metrics)]
    if not present:
        return "No finished runs.", []
    first = present[0]
    with_paper = any(lv in ((paper or {}).get(v) or {}) for v in present for lv in levels)
    acc_rows, diff_rows, csv_rows = [], [], []
    for variant in present:
        cells_text, diffs_text = [], []
        for title, name in columns:
            mine = _values(metrics, variant, name)
            iv = stats.bounded_mean_ci(mine.values(), 0.0, 1.0)  # an accuracy: the interval stays in [0, 1]
            cells_text.append(stats.format_ci(iv))
            if variant == first:
                diffs_text.append("(reference)")
                d = None
            else:
                d = stats.paired_difference(mine, _values(metrics, first, name))
                diffs_text.append(stats.format_diff(d))
            csv_rows.append(
                {
                    "variant": variant,
                    "label": labels.get(variant, variant),
                    "column": title,
                    "mean": iv.mean,
                    "lo": iv.lo,
                    "hi": iv.hi,
                    "seeds": iv.n,
                    **stats.diff_columns(d),
                }
            )
        reference = (paper or {}).get(variant) or {}
        paper_text = " / ".join(f"{reference[lv]:.2f}" if lv in reference else "-" for lv in levels)
        acc_rows.append(
            [labels.get(variant, variant), *cells_text, str(len(_values(metrics, variant, "val/accuracy")))]
            + ([paper_text] if with_paper else [])
        )
        diff_rows.append([labels.get(variant, variant), *diffs_text])
    headers = ["Model", *(t for t, _ in columns)]
    text = (
        "Exact-match accuracy (every answer token right, teacher-forced argmax), mean over seeds "
        "[95% Student-t interval on the logit scale, so it stays inside [0, 1]]:\n\n"
        + markdown_table(
            [*headers, "seeds"] + ([f"paper ({' / '.join(levels)})"] if with_paper else []), acc_rows
        )
        + f"\n\nDifference to {labels.get(first, first)}, paired by seed [95% interval], * when it excludes 0:"
        + "\n\n"
        + markdown_table(headers, diff_rows)
        + "\n\n"
        + holm_line(csv_rows)
    )
    return text, csv_rows


def holm_line(csv_rows: list[dict[str, Any]]) -> str:
    """How many paired comparisons the difference table makes (every row against the first, every
    column: one family), and which intervals excluding 0 survive Holm's correction; marks
    `holm_survives` on the CSV rows."""
    n, excluding, kept_rows = stats.mark_holm(csv_rows, "diff_lo", "diff_hi")
    if not n:
        return "No paired comparison (fewer than two seeds)."
    kept = [f"{r['label']} {r['column']}" for r in kept_rows]
    return (
        f"{n} comparisons (each row against the first, each column); {len(kept)} of the "
        f"{len(excluding)} starred survive Holm's correction for {n} comparisons at 5%"
        + (f": {', '.join(kept)}." if kept else ".")
        + " (`holm_survives` in `task_accuracy.csv`)"
    )


def attention_table(
    order: list[str], labels: dict[str, str], metrics: dict[tuple[str, int], dict[str, float]]
) -> tuple[str, list[dict[str, Any]]]:
    """Table 3: answer and noise shares per depth (or overall when the task has no depths): Markdown and
    CSV rows."""
    depths = sorted(
        {
            name.split("/depth_")[1]
            for m in metrics.values()
            for name in m
            if name.startswith("attn/answer_share/depth_")
        },
        key=_sort_key,
    )
    suffixes = [(f"{d}%", f"/depth_{d}") for d in depths] or [("all", "")]
    present = [
        v
        for v in order
        if any(k[0] == v and any(n.startswith("attn/") for n in m) for k, m in metrics.items())
    ]
    if not present:
        return (
            "No attention shares were logged: the runs' attention components do not implement "
            "`attend_with_maps` (ablate.core.contract), so their maps could not be read."
        ), []
    missing = [labels.get(v, v) for v in order if v not in present and any(k[0] == v for k in metrics)]
    rows, csv_rows = [], []
    for kind in ("answer", "noise"):
        for variant in present:
            cells = []
            for title, s in suffixes:
                values = _values(metrics, variant, f"attn/{kind}_share{s}").values()
                iv = stats.bounded_mean_ci(values, 0.0, None)  # |effective map| mass: >= 0, Diff's can pass 1
                cells.append(stats.format_ci(iv))
                csv_rows.append(
                    {
                        "variant": variant,
                        "label": labels.get(variant, variant),
                        "share": kind,
                        "depth": title,
                        "mean": iv.mean,
                        "lo": iv.lo,
                        "hi": iv.hi,
                        "seeds": iv.n,
                    }
                )
            rows.append([f"{labels.get(variant, variant)}", kind, *cells])
    return (
        "Attention share at the positions that produce the answers, averaged over heads and layers, mean "
        "over seeds [95% interval on the log scale, so it stays above 0]. answer: share of |effective map| mass on the answer needle's span; noise: "
        "on the rest of the context (softmax: A; Diff: A1 - λ A2). Columns: depth of the answer needle.\n\n"
        + markdown_table(["Model", "share", *(t for t, _ in suffixes)], rows)
        + (
            f"\n\nNot available for {', '.join(missing)}: its attention does not implement `attend_with_maps` "
            "(ablate.core.contract)."
            if missing
            else ""
        )
    ), csv_rows


def heatmap_grids(order: list[str], metrics: dict[tuple[str, int], dict[str, float]]) -> dict[str, Any]:
    """Figure 5's numbers: {variant: {"levels", "depths", "lengths", "grids": (levels, depths, lengths) mean
    accuracy over seeds, NaN where no run logged the cell, "seeds"}}; {} when the cells have no depth x length."""
    cells = _cells(metrics)
    if not cells or not {"depth", "length"} <= set(cells[0]):
        return {}
    level_key = next((k for k in cells[0] if k not in ("depth", "length")), None)
    levels = sorted({c.get(level_key, "") for c in cells}, key=_sort_key)
    depths = sorted({c["depth"] for c in cells}, key=_sort_key)
    lengths = sorted({c["length"] for c in cells}, key=_sort_key)
    names = {
        (c.get(level_key, ""), c["depth"], c["length"]): CELL_PREFIX
        + "/".join(f"{k}_{v}" for k, v in c.items())
        for c in cells
    }
    out = {}
    for variant in order:
        runs = [m for (v, _), m in metrics.items() if v == variant]
        if not runs:
            continue
        grids = np.full((len(levels), len(depths), len(lengths)), np.nan)
        for a, level in enumerate(levels):
            for i, d in enumerate(depths):
                for j, n in enumerate(lengths):
                    name = names.get((level, d, n), "")
                    seen = [m[name] for m in runs if name in m and math.isfinite(m[name])]
                    grids[a, i, j] = float(np.mean(seen)) if seen else np.nan
        out[variant] = {
            "level_key": level_key,
            "levels": levels,
            "depths": depths,
            "lengths": lengths,
            "grids": grids,
            "seeds": len(runs),
        }
    return out


def plot_heatmaps(
    order: list[str], labels: dict[str, str], metrics: dict[tuple[str, int], dict[str, float]], folder: Path
) -> list[Path]:
    """Figure 5: one PNG per variant, depth (rows) x length (columns) accuracy, one panel per level."""
    from ablate.core import plot_style

    paths = []
    for variant, h in heatmap_grids(order, metrics).items():
        fig, axes = plot_style.figure_grid(len(h["levels"]), 3.2 * len(h["levels"]) + 1, 3.2)
        fig.set_layout_engine("constrained")  # the colorbar and panel titles without overlaps
        image = None
        for ax, level, grid in zip(axes, h["levels"], h["grids"]):
            image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
            for i in range(grid.shape[0]):
                for j in range(grid.shape[1]):
                    if math.isfinite(grid[i, j]):
                        ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7)
            ax.set_xticks(range(len(h["lengths"])), h["lengths"])
            ax.set_yticks(range(len(h["depths"])), [f"{d}%" for d in h["depths"]])
            ax.set_xlabel("context length (tokens)")
            ax.set_title(f"{h['level_key']} {level}" if h["level_key"] else "", fontsize=9)
        axes[0].set_ylabel("answer depth")
        if image is not None:
            fig.colorbar(image, ax=list(axes), shrink=0.8, label="exact-match accuracy (0-1)")
        fig.suptitle(
            f"{labels.get(variant, variant)}: exact match, mean over {h['seeds']} seed(s)", fontsize=10
        )
        paths.append(plot_style.save(fig, folder / f"heatmap_{variant}.png", tight=False))
    return paths


def write_task_report(ctx: SweepContext, records: list[Any], folder: Path) -> list[Path]:
    """Write the task tables and heatmaps into `folder` (attached to the parent run with the rest)."""
    order = list(ctx.recipe.variants)
    labels = {k: v.label for k, v in ctx.recipe.variants.items()}
    metrics = run_metrics(ctx, records)
    folder.mkdir(parents=True, exist_ok=True)
    paper = {k: v.paper or {} for k, v in ctx.recipe.variants.items()}
    accuracy, csv_rows = accuracy_table(order, labels, metrics, paper)
    title = f"# {ctx.recipe.name} at scale {ctx.scale}: task accuracy (Table 2 style)"
    note = (
        "table.md's Valid column is the loss on the answer tokens (val/loss of a task); AR-Hit and Others do "
        "not apply to tasks."
    )
    (folder / "task_accuracy.md").write_text(f"{title}\n\n{accuracy}\n\n{note}\n")
    write_csv(folder / "task_accuracy.csv", csv_rows)
    attention, attention_rows = attention_table(order, labels, metrics)
    (folder / "task_attention.md").write_text(
        f"# {ctx.recipe.name} at scale {ctx.scale}: attention to answer and noise (Table 3 style)\n\n{attention}\n"
    )
    write_csv(folder / "task_attention.csv", attention_rows)
    written = [
        folder / f"task_{name}" for name in ("accuracy.md", "accuracy.csv", "attention.md", "attention.csv")
    ]
    written += plot_heatmaps(order, labels, metrics, folder)
    print(f"[report] {folder / 'task_accuracy.md'}\n\n{accuracy}\n\n{attention}\n", flush=True)
    return written
