"""Per-run loss curve `L(t) = E + A * t^-alpha` over (tokens seen, validation loss) after warmup.

`converged` is a statement about the fitted curve, not the optimiser: the run counts as converged when
the curve predicts that doubling the tokens from the last point would lower the loss by less than
`rel_gain_threshold` (default 1%) of the last loss, i.e. `(L(t_last) - L(2 t_last)) / L(t_last) < 0.01`.
Points during warmup are dropped (the learning rate is still rising and the curve is not a power law).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ablate.core.errors import UserError

from .forms import FORMS, predict_theta, theta_to_params
from .optimize import fit_theta, single_blas_thread

DEFAULT_REL_GAIN = 0.01


@dataclass(frozen=True)
class LossCurveFit:
    E: float
    A: float
    alpha: float
    n_points: int
    last_tokens: float
    predicted_gain: float  # (L(t_last) - L(2 t_last)) / L(t_last) from the fitted curve
    converged: bool  # predicted_gain < rel_gain_threshold
    optimizer_ok: bool

    def predict(self, tokens: np.ndarray | float) -> np.ndarray:
        return self.E + self.A * np.asarray(tokens, dtype=float) ** -self.alpha


def fit_loss_curve(
    tokens: Sequence[float],
    loss: Sequence[float],
    warmup_tokens: float = 0.0,
    rel_gain_threshold: float = DEFAULT_REL_GAIN,
) -> LossCurveFit:
    """Fit one run's validation curve after `warmup_tokens`; see the module doc for `converged`."""
    t = np.asarray(tokens, dtype=float)
    y = np.asarray(loss, dtype=float)
    if t.shape != y.shape or t.ndim != 1:
        raise UserError(
            f"loss curve: tokens and loss must be equal-length lists, got {t.shape} and {y.shape}"
        )
    ok = np.isfinite(t) & np.isfinite(y) & (t > warmup_tokens)
    t, y = t[ok], y[ok]
    if np.any(y <= 0) or np.any(t <= 0):
        raise UserError("loss curve: tokens and loss must be positive")
    if np.unique(t).size < 3:
        raise UserError(
            f"loss curve: {np.unique(t).size} distinct points after warmup ({warmup_tokens:g} tokens); "
            "E + A*t^-alpha needs at least 3"
        )
    form = FORMS["tokens"]
    centre = np.array([np.log(t).mean()])
    x = (np.log(t) - centre[0])[None, :]
    with single_blas_thread():
        theta, _, opt_ok = fit_theta(x, y, n_starts=6)
    p = theta_to_params(form, theta, centre)
    t_last = float(t.max())
    xs = np.log([t_last, 2 * t_last])[None, :] - centre[0]
    l_last, l_double = predict_theta(theta, xs)
    gain = float((l_last - l_double) / l_last)
    return LossCurveFit(
        E=p["E"],
        A=p["B"],
        alpha=p["beta"],
        n_points=int(t.size),
        last_tokens=t_last,
        predicted_gain=gain,
        converged=bool(gain < rel_gain_threshold) and math.isfinite(gain),
        optimizer_ok=opt_ok,
    )
