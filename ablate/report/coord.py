"""The coordinate check's report (ablate.train.coord): a CSV of every measurement, a CSV of each curve's
slope against width, a plot, and a short text naming the curves that are not flat.

A curve is one (variant, parametrization, layer, kind) at the last step: the RMS, averaged over seeds,
against width. Its slope is the least-squares slope of log2 RMS on log2 width: how many doublings of the
RMS one doubling of width brings. Flat means |slope| <= `FLAT` (0.25: a doubling of width moves the RMS by
less than 19%); μP predicts 0 for every curve, the standard parametrization about +0.5 to +1 for the
changes (Tensor Programs V, Figure 5).
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FLAT = 0.25
KINDS = ("change", "activation")


@dataclass(frozen=True)
class Curve:
    variant: str
    parametrization: str
    layer: str
    kind: str
    widths: tuple[int, ...]
    rms: tuple[float, ...]  # mean over seeds, per width

    @property
    def slope(self) -> float:
        xs = [math.log2(w) for w in self.widths]
        ys = [math.log2(max(r, 1e-300)) for r in self.rms]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        den = sum((x - mx) ** 2 for x in xs)
        return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0

    @property
    def flat(self) -> bool:
        return abs(self.slope) <= FLAT


def curves(rows: Sequence[dict[str, Any]], step: int | None = None) -> list[Curve]:
    """The curves at `step` (default: the last step measured)."""
    step = max(r["step"] for r in rows) if step is None else step
    acc: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        if r["step"] == step:
            acc[(r["variant"], r["parametrization"], r["layer"], r["kind"], r["width"])].append(r["rms"])
    grouped: dict[tuple, dict[int, float]] = defaultdict(dict)
    for (variant, par, layer, kind, width), values in acc.items():
        grouped[(variant, par, layer, kind)][width] = sum(values) / len(values)
    out = []
    for (variant, par, layer, kind), by_width in grouped.items():
        widths = tuple(sorted(by_width))
        out.append(Curve(variant, par, layer, kind, widths, tuple(by_width[w] for w in widths)))
    return sorted(out, key=lambda c: (c.variant, c.parametrization, c.kind, c.layer))


def read_rows(path: Path) -> list[dict[str, Any]]:
    """coord.csv back as rows, typed: a report folder is regenerated from it with `write`."""
    with path.open(newline="") as f:
        return [
            {
                **r,
                "width": int(r["width"]),
                "seed": int(r["seed"]),
                "step": int(r["step"]),
                "rms": float(r["rms"]),
            }
            for r in csv.DictReader(f)
        ]


def write(rows: Sequence[dict[str, Any]], out: Path, *, labels: dict[str, str] | None = None) -> str:
    """coord.csv, slopes.csv, coord.png and report.md in `out`; returns the report's text."""
    out.mkdir(parents=True, exist_ok=True)
    fields = ["variant", "parametrization", "width", "seed", "step", "layer", "kind", "rms"]
    with (out / "coord.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows({k: r[k] for k in fields} for r in rows)
    found = curves(rows)
    with (out / "slopes.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["variant", "parametrization", "layer", "kind", "slope", "flat", "widths", "rms"])
        for c in found:
            writer.writerow(
                [c.variant, c.parametrization, c.layer, c.kind, f"{c.slope:.3f}", c.flat,
                 " ".join(map(str, c.widths)), " ".join(f"{r:.4g}" for r in c.rms)]
            )  # fmt: skip
    plot(found, out / "coord.png", labels=labels or {})
    text = summary(found, step=max(r["step"] for r in rows))
    (out / "report.md").write_text(text)
    return text


def summary(found: Sequence[Curve], *, step: int) -> str:
    """Per (variant, parametrization, kind): how many curves are flat, the largest slope, and the ones that
    are not flat by name."""
    lines = [
        f"# Coordinate check at step {step}",
        "",
        f"Slope = d log2(RMS) / d log2(width), least squares over the widths; flat: |slope| <= {FLAT}.",
        "",
        "| variant | parametrization | kind | flat | largest slope | not flat |",
        "|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str, str], list[Curve]] = defaultdict(list)
    for c in found:
        groups[(c.variant, c.parametrization, c.kind)].append(c)
    for (variant, par, kind), cs in sorted(groups.items()):
        worst = max(cs, key=lambda c: abs(c.slope))
        bad = ", ".join(f"{c.layer} ({c.slope:+.2f})" for c in cs if not c.flat) or "-"
        lines.append(
            f"| {variant} | {par} | {kind} | {sum(c.flat for c in cs)}/{len(cs)} | "
            f"{worst.layer} {worst.slope:+.2f} | {bad} |"
        )
    return "\n".join(lines) + "\n"


def plot(found: Sequence[Curve], path: Path, *, labels: dict[str, str]) -> None:
    """One panel per (variant, parametrization) and kind: RMS against width, one line per layer, log-log."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = sorted({(c.variant, c.parametrization) for c in found})
    fig = Figure(figsize=(3.6 * len(panels), 6.4), dpi=110)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(KINDS), len(panels), squeeze=False)
    layers = sorted({c.layer for c in found})
    from matplotlib import colormaps

    tab20 = colormaps["tab20"]  # 14 layers at 4 blocks: more than the 10 colours of the default cycle
    colors = {layer: tab20(i % 20) for i, layer in enumerate(layers)}
    for col, (variant, par) in enumerate(panels):
        for row, kind in enumerate(KINDS):
            ax = axes[row][col]
            for c in found:
                if (c.variant, c.parametrization, c.kind) == (variant, par, kind):
                    style = "-" if c.flat else "--"
                    ax.plot(c.widths, c.rms, style, marker="o", ms=3, color=colors[c.layer], label=c.layer)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{labels.get(variant, variant)}, {par}: {kind}", fontsize=9)
            ax.set_xlabel("width (d_model)", fontsize=8)
            ax.tick_params(labelsize=7)
            if col == 0:
                ax.set_ylabel("RMS at the last step", fontsize=8)
    handles, names = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc="lower center", ncol=min(6, len(names)), fontsize=7)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path)
