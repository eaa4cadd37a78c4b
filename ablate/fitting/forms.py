"""The fitted forms and their objective: Huber loss on log-loss, summed over points (docs/paper.md).

Internally every form is `L = E + sum_k exp(a_k - e_k * x_k)` with `x_k = log(v_k) - c_k` the centred log
of a variable (params N or tokens D). Centring at `c_k` (the mean log of the trained values) makes `a_k`
the log of the term at the middle of the data, which decorrelates it from the exponent; the public
coefficient is recovered as `log A = a + alpha * c`.

The internal vector is `theta = [E, a_1, e_1, (a_2, e_2)]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

HUBER_DELTA = 1e-3  # on log-loss residuals (docs/paper.md, "Scaling")
EXPONENT_BOUNDS = (1e-4, 3.0)  # "(0, 3]": strictly positive so the term cannot merge into E
LOGCOEF_BOUNDS = (-50.0, 50.0)  # log of a term at the centre of the data; only guards overflow


@dataclass(frozen=True)
class Form:
    """One scaling-law form: which variables it has terms for and the public parameter names."""

    name: str
    variables: tuple[str, ...]  # "params" and/or "tokens"
    coef_names: tuple[str, ...]  # public coefficient per term
    exp_names: tuple[str, ...]  # public exponent per term
    formula: str

    @property
    def param_names(self) -> tuple[str, ...]:
        return ("E", *self.coef_names, *self.exp_names)

    @property
    def n_params(self) -> int:
        return 1 + 2 * len(self.variables)


FORMS: dict[str, Form] = {
    "size": Form("size", ("params",), ("A",), ("alpha",), "L(N) = E + A * N^-alpha"),
    "tokens": Form("tokens", ("tokens",), ("B",), ("beta",), "L(D) = E + B * D^-beta"),
    "joint": Form(
        "joint", ("params", "tokens"), ("A", "B"), ("alpha", "beta"), "L(N, D) = E + A / N^alpha + B / D^beta"
    ),
}


def theta_to_params(form: Form, theta: np.ndarray, centre: np.ndarray) -> dict[str, float]:
    """Internal vector -> public {"E", "A", "alpha", ...} in the units of the data."""
    out = {"E": float(theta[0])}
    for k, (cn, en) in enumerate(zip(form.coef_names, form.exp_names)):
        a, e = float(theta[1 + 2 * k]), float(theta[2 + 2 * k])
        logc = a + e * float(centre[k])
        out[cn] = math.exp(logc) if logc < 709.0 else math.inf
        out[en] = e
    return out


def params_to_theta(form: Form, params: dict[str, float], centre: np.ndarray) -> np.ndarray:
    theta = [params["E"]]
    for k, (cn, en) in enumerate(zip(form.coef_names, form.exp_names)):
        theta += [math.log(params[cn]) - params[en] * float(centre[k]), params[en]]
    return np.asarray(theta, dtype=float)


def predict_theta(theta: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Loss at centred log-variables `x` (shape (K, n)) for one theta, or many thetas (shape (m, P))."""
    theta = np.asarray(theta, dtype=float)
    if theta.ndim == 1:
        return theta[0] + np.exp(theta[1::2, None] - theta[2::2, None] * x).sum(axis=0)
    terms = np.exp(theta[:, 1::2, None] - theta[:, 2::2, None] * x[None, :, :])  # (m, K, n)
    return theta[:, 0, None] + terms.sum(axis=1)


def objective(
    theta: np.ndarray, x: np.ndarray, log_loss: np.ndarray, weight: np.ndarray, delta: float = HUBER_DELTA
) -> tuple[float, np.ndarray]:
    """Weighted SUM of Huber(log L_pred - log L) and its analytic gradient in theta.

    Summed, not averaged: with an average the objective is ~1e-6 and L-BFGS-B's relative ftol stops early.
    Weights are bootstrap multiplicities (how often a point's run was drawn).
    """
    terms = np.exp(theta[1::2, None] - theta[2::2, None] * x)  # (K, n)
    pred = theta[0] + terms.sum(axis=0)
    if np.any(pred <= 0.0):
        return math.inf, np.zeros_like(theta)
    r = np.log(pred) - log_loss
    quad = np.abs(r) <= delta
    h = np.where(quad, 0.5 * r * r, delta * (np.abs(r) - 0.5 * delta))
    dh = np.where(quad, r, delta * np.sign(r)) * weight / pred
    grad = np.empty_like(theta)
    grad[0] = dh.sum()
    grad[1::2] = terms @ dh
    grad[2::2] = -(terms * x) @ dh
    return float(weight @ h), grad


def objective_batch(
    thetas: np.ndarray, x: np.ndarray, log_loss: np.ndarray, weight: np.ndarray, delta: float = HUBER_DELTA
) -> np.ndarray:
    """The objective for many thetas at once (shape (m, P)); used to rank a grid of starting points."""
    pred = predict_theta(thetas, x)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.log(pred) - log_loss[None, :]
    ar = np.abs(r)
    h = np.where(ar <= delta, 0.5 * r * r, delta * (ar - 0.5 * delta))
    out = h @ weight
    return np.where(np.isfinite(out), out, math.inf)
