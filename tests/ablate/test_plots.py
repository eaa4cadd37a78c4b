"""Every plot type: its legend lists exactly what it draws, a variant keeps its colour across plots, axes
carry units, and a one-point series is drawn (markers), not an invisible one-point line."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ablate.core import plot_style
from ablate.report.run_records import RunRecord

ORDER = ["transformer", "transformer_d256", "diff"]
LABELS = {"transformer": "Transformer", "transformer_d256": "Transformer", "diff": "Diff Transformer"}


@pytest.fixture
def figures(monkeypatch):
    """The figures the plot functions save, instead of writing PNGs."""
    saved = []

    def keep(fig, path, caption=None, tight=True):
        saved.append(fig)
        return Path(path)

    monkeypatch.setattr(plot_style, "save", keep)
    return saved


def _ctx():
    variants = {k: SimpleNamespace(label=v, paper=None) for k, v in LABELS.items()}
    return SimpleNamespace(recipe=SimpleNamespace(variants=variants), scale="tiny")


UNIQUE = {"transformer": "Transformer [transformer]", "transformer_d256": "Transformer [transformer_d256]"}
UNIQUE["diff"] = "Diff Transformer"


def _check_legends(fig) -> None:
    for ax in fig.axes:
        if ax.get_legend() is not None:
            assert plot_style.legend_entries(ax) == plot_style.drawn_labels(ax)
            assert len(set(plot_style.legend_entries(ax))) == len(plot_style.legend_entries(ax))  # no twins
        for label in (ax.get_xlabel(), ax.get_ylabel()):  # a unit, or a count that is its own unit
            assert any(unit in label for unit in ("(", "tokens", "parameters", "bits", "ratio")), label


def _colors(fig) -> dict[str, str]:
    from matplotlib.colors import to_hex

    return {line.get_label(): to_hex(line.get_color()) for ax in fig.axes for line in ax.lines}


def _records(seeds=(0, 1)) -> list[RunRecord]:
    out = []
    for i, variant in enumerate(ORDER):
        for seed in seeds:
            curve = [(t, 5.0 - 0.1 * i - 1e-6 * t) for t in (1000, 2000, 3000)]
            out.append(RunRecord(variant, seed, "", "finished", f"{variant}-{seed}", curve=curve))
    return out


def test_loss_curves_one_entry_per_variant_markers_at_validations(figures, tmp_path):
    from ablate.report.table import plot_loss_curves

    plot_loss_curves(_records(), UNIQUE, tmp_path / "x.png", ORDER)
    (fig,) = figures
    _check_legends(fig)
    ax = fig.axes[0]
    assert plot_style.legend_entries(ax) == [
        "Transformer [transformer]",
        "Transformer [transformer_d256]",
        "Diff Transformer",
    ]
    assert all(line.get_marker() == "o" for line in ax.lines)  # the validations are marked
    assert ax.get_ylabel() == "validation loss (nats/token)"


def test_probe_plot_keeps_the_loss_plots_colours_and_promises_no_interval_for_one_seed(figures, tmp_path):
    from ablate.report.probes import ProbeGroup, plot_vs_bits
    from ablate.report.table import plot_loss_curves

    records = _records(seeds=(0,))
    values = {r.run_id: {f"quantization/loss/bits_{b}": 4.0 + 1 / b for b in (16, 8, 4)} for r in records}
    columns = ["bits_16", "bits_8", "bits_4"]
    plot_vs_bits(ProbeGroup(_ctx(), records, values, "quantization", "loss", columns), tmp_path / "q.png")
    plot_loss_curves(records, UNIQUE, tmp_path / "l.png", ORDER)
    probe, loss = figures
    _check_legends(probe)
    assert _colors(probe) == _colors(loss)  # a variant keeps its colour
    title = probe.axes[0].get_title()
    assert "one seed: no intervals" in title and "95%" not in title
    assert "nats/token" in probe.axes[0].get_ylabel()


def test_bench_plot_draws_what_its_legend_lists_at_a_single_length(figures, tmp_path):
    from ablate.bench.results import _plot

    rows = [
        {"variant": v, "seq_len": 1024, "train_tok_s": 100.0 + i, "fwd_tok_s": 300.0, "peak_mem_mb": 50.0}
        for i, v in enumerate(["transformer", "diff"])
    ]
    ceilings = {"diff": {1024: {"dense": (0.9, 0.0), "flash": (0.95, 0.0)}}}
    _plot(rows, ["transformer", "diff"], ceilings, tmp_path / "b.png")
    (fig,) = figures
    _check_legends(fig)
    ratio = fig.axes[3]
    assert plot_style.legend_entries(ratio) == [
        "diff / transformer (training)",
        "ceiling: dense",
        "ceiling: flash",
    ]
    assert all(line.get_marker() not in (None, "None", "") for line in ratio.lines)  # one point: a marker
    assert ratio.get_ylim()[0] == 0 and all(ax.get_ylim()[0] == 0 for ax in fig.axes)


def test_gap_plot_and_scaling_plot_list_what_they_draw(figures, tmp_path):
    from ablate.report.budgets import plot_gaps
    from ablate.report.plots import Series, scaling_plot

    gaps = [
        {
            "variant": "diff",
            "label": "Diff Transformer",
            "tokens": t,
            "gap": 0.1,
            "lo": 0.05,
            "hi": 0.15,
            "n_seeds": 3,
        }
        for t in (1e6, 2e6, 4e6)
    ]
    plot_gaps(gaps, ORDER, tmp_path / "g.png", "Transformer")
    x = np.array([1e6, 2e6, 4e6])
    scaling_plot(
        [
            Series("diff", x, 3 + 1 / np.log(x), x, 3 + 1 / np.log(x), color="C0"),
            Series("", x, x * 0 + 3, color="C0"),
        ],
        tmp_path / "s.png",
        xlabel="training tokens D",
    )
    gap, scaling = figures
    _check_legends(gap)
    assert plot_style.legend_entries(gap.axes[0]) == ["Transformer (reference)", "Diff Transformer"]
    assert plot_style.legend_entries(scaling.axes[0]) == plot_style.drawn_labels(scaling.axes[0]) == ["diff"]


def test_a_one_point_series_is_a_marker_and_the_check_sees_an_invisible_line():
    fig, ax = plot_style.figure()
    plot_style.series(ax, [1.0], [2.0], label="one point", color="C0")
    ax.plot([1.0], [2.0], linestyle="--", label="invisible")  # what the old bench plot drew
    assert plot_style.drawn_labels(ax) == ["one point"]
