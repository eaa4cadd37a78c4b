"""One fit: rank a grid of starting points, polish the best few with L-BFGS-B, keep the best optimum.

The grid spans E (fractions of min L) x exponents; for each grid point the coefficients are solved by
linear least squares on relative errors (they enter linearly once E and the exponents are fixed), so
every start is already a sensible curve. The whole grid is scored with the objective in one vectorised
pass and L-BFGS-B (analytic gradient, ftol = gtol = 1e-12) runs from the `n_starts` best grid points and
from any caller-supplied starts. Bootstrap refits pass the full-data optimum and the two best full-data
grid points instead of re-ranking the grid (which cost half of each refit).
"""

from __future__ import annotations

import contextlib
import itertools
import math

import numpy as np
from scipy.optimize import minimize

from .forms import EXPONENT_BOUNDS, LOGCOEF_BOUNDS, objective, objective_batch

E_FRACTIONS = (0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99)
EXPONENT_GRID = (0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.2)
LBFGS_OPTIONS = {"ftol": 1e-12, "gtol": 1e-12, "maxiter": 5000, "maxfun": 20000, "maxls": 50}


def single_blas_thread() -> contextlib.AbstractContextManager:
    """Limit BLAS to one thread while fitting.

    L-BFGS-B calls BLAS on vectors of length 3-5: threads only add wake-up latency, and with several
    processes (or a busy machine) OpenBLAS's spinning threads made fits 3-8x slower in our measurements.
    threadpoolctl comes with scikit-learn (an MLflow dependency); without it this is a no-op.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def grid_starts(x: np.ndarray, loss: np.ndarray, weight: np.ndarray, e_max: float) -> np.ndarray:
    """All grid starting points, shape (G, 1 + 2K), coefficients solved per grid point."""
    k = x.shape[0]
    combos = np.array(
        [(f * e_max, *es) for f in E_FRACTIONS for es in itertools.product(EXPONENT_GRID, repeat=k)]
    )
    e0, exps = combos[:, 0], combos[:, 1:]
    design = np.exp(-exps[:, :, None] * x[None, :, :])  # (G, K, n)
    target = loss[None, :] - e0[:, None]  # (G, n), > 0 as every E fraction is < 1
    w = weight / loss**2  # least squares on relative error ~ on log-loss
    gram = np.einsum("gkn,gjn,n->gkj", design, design, w)
    gram += 1e-12 * np.eye(k)[None] * np.trace(gram, axis1=1, axis2=2)[:, None, None]
    rhs = np.einsum("gkn,gn,n->gk", design, target, w)
    coef = np.linalg.solve(gram, rhs[..., None])[..., 0]
    floor = 1e-6 * float(np.average(loss, weights=weight))
    logc = np.log(np.maximum(coef, floor))
    theta = np.empty((combos.shape[0], 1 + 2 * k))
    theta[:, 0] = e0
    theta[:, 1::2] = np.clip(logc, *LOGCOEF_BOUNDS)
    theta[:, 2::2] = exps
    return theta


def ranked_grid(x: np.ndarray, loss: np.ndarray, weight: np.ndarray, n: int) -> np.ndarray:
    """The `n` grid starting points with the lowest objective, best first."""
    grid = grid_starts(x, loss, weight, float(loss[weight > 0].min()))
    scores = objective_batch(grid, x, np.log(loss), weight)
    return grid[np.argsort(scores, kind="stable")[:n]]


def fit_theta(
    x: np.ndarray,
    loss: np.ndarray,
    weight: np.ndarray | None = None,
    n_starts: int = 6,
    extra_starts: np.ndarray | None = None,
) -> tuple[np.ndarray, float, bool]:
    """Best (theta, objective, converged) from the `n_starts` best grid points and `extra_starts`.

    Zero-weight points are ignored. With `n_starts=0` only `extra_starts` are polished.
    """
    if weight is None:
        weight = np.ones_like(loss)
    keep = weight > 0
    x, loss, weight = x[:, keep], loss[keep], weight[keep].astype(float)
    log_loss = np.log(loss)
    e_max = float(loss.min())
    k = x.shape[0]
    bounds = [(0.0, e_max)] + [LOGCOEF_BOUNDS, EXPONENT_BOUNDS] * k

    starts = list(ranked_grid(x, loss, weight, n_starts)) if n_starts > 0 else []
    if extra_starts is not None:
        for s in np.atleast_2d(extra_starts):
            s = s.copy()
            s[0] = min(s[0], e_max)  # a resample may have a smaller min L than the full data
            starts.append(s)

    if not starts:
        raise ValueError("fit_theta needs n_starts > 0 or extra_starts")
    best_theta, best_fun, best_ok = starts[0], math.inf, False
    for s in starts:
        res = minimize(
            objective,
            s,
            args=(x, log_loss, weight),
            jac=True,
            method="L-BFGS-B",
            bounds=bounds,
            options=LBFGS_OPTIONS,
        )
        if np.isfinite(res.fun) and res.fun < best_fun:
            # L-BFGS-B often ends on "ABNORMAL" line-search exits at this tolerance: the objective
            # is flat to machine precision there, so that counts as converged; hitting maxiter does not.
            best_theta, best_fun, best_ok = res.x, float(res.fun), res.nit < LBFGS_OPTIONS["maxiter"]
    return np.asarray(best_theta, dtype=float), best_fun, best_ok
