"""Scaling-law and loss-curve fits: the public face of `ablate.fitting` (see its modules for the method).

    points = read_points_csv("runs.csv")            # params, tokens, loss[, arch, run_id]
    report = fit_points(points, "size", n_boot=1000, seed=0)
    write_fit(report, "reports/scaling-size")       # fit.json, fit.md, loss_vs_params.png

Token-scaling fits that use checkpoints inside a run: a checkpoint is not a separate run at that token
budget (the learning-rate schedule differs); the bootstrap resamples whole runs and the output says so.
"""

from pathlib import Path

from ablate.fitting import (
    FORMS,
    ArchFit,
    FitReport,
    Form,
    LossCurveFit,
    Point,
    Ratio,
    as_points,
    equal_loss_ratios,
    fit_arch,
    fit_loss_curve,
    fit_points,
    get_form,
    read_points_csv,
    run_fit_csv,
)


def write_fit(report: FitReport, out_dir: str | Path) -> list[Path]:
    """Write fit.json, fit.md and the loss_vs_*.png plots; returns the paths written.

    matplotlib is imported here, on first use, so fitting alone stays light.
    """
    from ablate.fitting.output import write_fit as _write

    return _write(report, out_dir)


__all__ = [
    "FORMS",
    "ArchFit",
    "FitReport",
    "Form",
    "LossCurveFit",
    "Point",
    "Ratio",
    "as_points",
    "equal_loss_ratios",
    "fit_arch",
    "fit_loss_curve",
    "fit_points",
    "get_form",
    "read_points_csv",
    "run_fit_csv",
    "write_fit",
]
