"""Scaling-law and loss-curve fits with bootstrap intervals over runs (docs/paper.md,
"Scaling"). Reads finished numbers only: nothing here imports torch or the models.

Modules: `forms` (the laws and the Huber objective), `optimize` (grid + L-BFGS-B), `points` (inputs, CSV),
`core` (one arch + bootstrap), `ratios` (equal-loss ratios), `curve` (per-run loss curves), `fit`
(`fit_points`). Writing a fit (fit.json, fit.md, plots) is the report layer's: `ablate.report.fit`.
"""

from .core import ArchFit, fit_arch
from .curve import LossCurveFit, fit_loss_curve
from .fit import FitReport, fit_points, get_form
from .forms import FORMS, Form
from .points import Point, as_points, read_points_csv
from .ratios import Ratio, equal_loss_ratios

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
]
