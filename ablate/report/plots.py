"""Scaling plots in the style of the paper's Figure 3: log x-axis, measured points, fitted curves, bands.

Uses matplotlib's object API with the Agg canvas (no pyplot, no global backend switch), so it is safe
inside servers and worker processes and never opens a window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


@dataclass
class Series:
    """One arm (or one arm at one fixed budget): measured points and, optionally, a fitted curve + band."""

    label: str
    x: np.ndarray
    y: np.ndarray
    curve_x: np.ndarray | None = None
    curve_y: np.ndarray | None = None
    band_lo: np.ndarray | None = None
    band_hi: np.ndarray | None = None
    color: str | None = None
    linestyle: str = "-"
    marker: str = "o"
    alpha: float = 1.0  # of the points (faint context points use ~0.3)


def scaling_plot(
    series: Sequence[Series],
    path: str | Path,
    xlabel: str,
    ylabel: str = "validation loss",
    title: str | None = None,
    footnote: str | None = None,
) -> Path:
    """Write one PNG with every series on a log x-axis; returns the path."""
    fig = Figure(figsize=(6.4, 4.6), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for s in series:
        color = s.color
        if s.curve_x is not None and s.curve_y is not None:
            (line,) = ax.plot(s.curve_x, s.curve_y, linestyle=s.linestyle, color=color, label=s.label)
            color = line.get_color()
            if s.band_lo is not None and s.band_hi is not None:
                ax.fill_between(s.curve_x, s.band_lo, s.band_hi, color=color, alpha=0.18, linewidth=0)
            label = None
        else:
            label = s.label
        if len(s.x):
            ax.scatter(s.x, s.y, color=color, marker=s.marker, s=22, zorder=3, label=label, alpha=s.alpha)
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    if any(s.label for s in series):
        ax.legend(fontsize=8, frameon=False)
    if footnote:
        fig.text(0.01, 0.01, footnote, fontsize=7, color="0.35")
    fig.tight_layout(rect=(0, 0.03 if footnote else 0, 1, 1))
    path = Path(path)
    fig.savefig(path, format="png")
    return path
