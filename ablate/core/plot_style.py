"""One look for every plot ablate writes: the figure, a variant's colour, lines with their measured points.

- A variant keeps its colour in every plot of a recipe: the colour is its position in the recipe's
  variant order (`variant_colors`), not the order lines happen to be drawn in.
- Measured points are markers; a line joins them. A series of one point is a marker alone (a one-point
  line draws nothing, and the legend would list what is not there).
- The legend is built from what was drawn (matplotlib's labelled artists), so it lists only what is
  drawn; `legend_entries` and `drawn_labels` let tests check that.
- Figures use matplotlib's object API with the Agg canvas (no pyplot, no global backend): safe in workers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ablate.core.tables import si

PALETTE = tuple(f"C{i}" for i in range(10))  # matplotlib's default cycle, by name


def figure(width: float = 6.4, height: float = 4.4) -> tuple[Any, Any]:
    """(figure, axes) on an Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=120)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def figure_grid(n: int, width: float, height: float) -> tuple[Any, list[Any]]:
    """(figure, n axes side by side) on an Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(1, n, i + 1) for i in range(n)]


def variant_colors(order: Iterable[str]) -> dict[str, str]:
    """Variant -> colour, by its place in the recipe's variant order (the same in every plot)."""
    return {variant: PALETTE[i % len(PALETTE)] for i, variant in enumerate(order)}


def series(
    ax: Any,
    x: Sequence[float],
    y: Sequence[float],
    *,
    label: str | None,
    color: str,
    linestyle: str = "-",
    alpha: float = 1.0,
    linewidth: float = 1.4,
    marker: str = "o",
) -> Any:
    """A line through measured points with a marker at each; one point is a marker alone."""
    if len(x) == 1:
        return ax.plot(x, y, linestyle="none", marker=marker, color=color, alpha=alpha, label=label)[0]
    return ax.plot(
        x,
        y,
        linestyle=linestyle,
        marker=marker,
        markersize=3,
        color=color,
        alpha=alpha,
        lw=linewidth,
        label=label,
    )[0]


def finish(ax: Any, *, title: str, xlabel: str, ylabel: str, legend: bool = True) -> None:
    """Title, axis labels (with units), grid, and a legend of the labelled artists (none if none)."""
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if legend and drawn_labels(ax):
        ax.legend(fontsize=8, frameon=False)


def passes_axis(ax: Any, split_tokens: float, largest: float, note: str = "") -> None:
    """On a plot over training tokens: passes over the training split on a second (top) axis, and the
    tokens past one pass shaded, so a reader sees where the runs read their text again; `note`: the share
    read twice at the right edge (ablate.data.passes.axis_note). Nothing when the split's size is unknown."""
    if not split_tokens or not math.isfinite(split_tokens) or split_tokens <= 0:
        return
    from matplotlib.ticker import FuncFormatter, NullFormatter

    top = ax.secondary_xaxis("top", functions=(lambda t: t / split_tokens, lambda p: p * split_tokens))
    label = f"passes over the {si(split_tokens)}-token training split"
    top.set_xlabel(label + (f"\n{note}" if note else ""), fontsize=8 if not note else 7)
    top.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
    top.xaxis.set_minor_formatter(NullFormatter())
    top.tick_params(labelsize=7)
    if largest > split_tokens:
        left, right = ax.get_xlim()
        ax.axvspan(split_tokens, max(right, largest), color="0.88", zorder=0, lw=0, label="past one pass")
        ax.set_xlim(left, right)


def save(fig: Any, path: str | Path, caption: str | None = None, tight: bool = True) -> Path:
    """Write the PNG; `caption` goes under the axes (what the lines, markers and bands are). `tight=False`
    for a figure laid out by matplotlib's constrained layout."""
    if caption:
        fig.text(0.01, 0.01, caption, fontsize=7, color="0.3", wrap=True)
    if tight:
        fig.tight_layout(rect=(0, 0.06 if caption else 0, 1, 1))
    path = Path(path)
    fig.savefig(path, format="png", metadata={"Software": None})  # no version string: same bytes per data
    return path


def drawn_labels(ax: Any) -> list[str]:
    """Labels of the artists that draw something (a line with points, a filled band, a scatter)."""
    labels = []
    for artist in [*ax.lines, *ax.collections, *ax.patches]:
        label = artist.get_label()
        if not label or label.startswith("_"):
            continue
        if hasattr(artist, "get_xdata") and len(artist.get_xdata()) == 0:
            continue
        if (
            hasattr(artist, "get_xdata")
            and len(artist.get_xdata()) == 1
            and artist.get_marker() in (None, "None", "", " ")
        ):
            continue  # a one-point line without a marker draws nothing
        labels.append(label)
    return labels


def legend_entries(ax: Any) -> list[str]:
    legend = ax.get_legend()
    return [text.get_text() for text in legend.get_texts()] if legend else []
