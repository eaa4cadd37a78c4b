"""Scaling plots in the style of the paper's Figure 3: log x-axis, measured points, fitted curves, bands.

Drawn in the one style of every ablate plot (ablate.core.plot_style): measured points as markers, fitted
curves as lines, bands as shaded areas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ablate.data.passes import axis_note


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
    ylabel: str = "validation loss (nats/token)",
    title: str | None = None,
    footnote: str | None = None,
    split_tokens: float = float("nan"),
    samplings: Sequence[str] = (),
) -> Path:
    """Write one PNG with every series on a log x-axis; returns the path. `split_tokens`: on a plot over
    tokens, the training split's size, for the passes axis and the shading past one pass; `samplings`: how
    the plotted runs drew their windows (the share they read twice, on that axis)."""
    from ablate.core import plot_style

    fig, ax = plot_style.figure(6.4, 4.6)
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
    largest = max((float(max(s.x)) for s in series if len(s.x)), default=0.0)
    passes_axis(ax, split_tokens, largest, samplings)
    plot_style.finish(ax, title=title or "", xlabel=xlabel, ylabel=ylabel)
    return plot_style.save(fig, path, caption=footnote)


def passes_axis(ax: Any, split_tokens: float, largest: float, samplings: Sequence[str]) -> None:
    """The passes axis of a plot over training tokens (ablate.core.plot_style.passes_axis), with the share
    the plotted runs read twice at its right edge, by how they drew their windows (`samplings`)."""
    from ablate.core import plot_style

    plot_style.passes_axis(ax, split_tokens, largest, axis_note(split_tokens, largest, samplings))
