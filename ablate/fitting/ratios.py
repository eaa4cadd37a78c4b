"""Equal-loss ratios: how much of the reference architecture's parameters (or tokens) another needs.

For a trained value `v_B` of arch B: `L* = L_B(v_B)`, solve `L_A(v_A) = L*` and report `v_B / v_A`
(the paper's Section 3.2, Figure 3: "6.8B Diff matches 11B Transformer (62.2%)"). Both curves are decreasing, so
the solution is unique when it exists: it does not when `L*` is at or below A's asymptote (`E_A`, plus
the other term held fixed in the joint form), i.e. A cannot reach B's loss at any size. In the bootstrap
such a draw counts as ratio 0 (A would need infinitely many), so it widens the interval honestly
instead of being dropped.

Joint form: parameter ratios are taken at B's largest trained token budget, token ratios at B's
largest trained size. When B has more than `MAX_POINTS` distinct trained values, ratios are given at
`MAX_POINTS` of them spread evenly in log scale.

A fit with a parameter at its bound (`ArchFit.at_bound`) is not an interior optimum: a ratio from it has
status "at bound" and is not quoted (its numbers are kept for inspection).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .core import ArchFit
from .forms import predict_theta

MAX_POINTS = 10
RANGE_RTOL = 1e-9


@dataclass(frozen=True)
class Ratio:
    reference: str  # arch A (e.g. transformer)
    arch: str  # arch B (e.g. diff)
    quantity: str  # "params" or "tokens"
    at: float  # B's trained value v_B
    fixed: dict[str, float] = field(default_factory=dict)  # joint: the other variable, held fixed
    target_loss: float = math.nan  # L* = L_B(v_B)
    matched: float = math.nan  # v_A with L_A(v_A) = L*; NaN when there is no solution
    ratio: float = math.nan  # v_B / v_A
    lo: float = math.nan
    hi: float = math.nan
    status: str = "interpolated"  # "interpolated" | "extrapolated" | "no solution" | "at bound"
    n_boot: int = 0
    n_boot_no_solution: int = 0
    level: float = 0.95


def _solve(fit: ArchFit, thetas: np.ndarray, quantity: str, target: np.ndarray, fixed: dict) -> np.ndarray:
    """v_A for each theta row (m, P) with L_A(v_A) = target (m,); NaN where no solution."""
    thetas = np.atleast_2d(thetas)
    k = fit.form.variables.index(quantity)
    rest = thetas[:, 0].copy()
    for j, var in enumerate(fit.form.variables):
        if j != k:
            xj = math.log(fixed[var]) - fit.centre[j]
            rest += np.exp(thetas[:, 1 + 2 * j] - thetas[:, 2 + 2 * j] * xj)
    gap = np.asarray(target, dtype=float) - rest
    with np.errstate(invalid="ignore", divide="ignore"):
        xk = (thetas[:, 1 + 2 * k] - np.log(gap)) / thetas[:, 2 + 2 * k]
        v = np.exp(xk + fit.centre[k])
    return np.where(gap > 0, v, np.nan)


def _trained_values(fit: ArchFit, quantity: str) -> list[float]:
    vals = sorted({getattr(p, quantity) for p in fit.points})
    if len(vals) <= MAX_POINTS:
        return vals
    logs = np.log(vals)
    picks = np.linspace(logs[0], logs[-1], MAX_POINTS)
    return sorted({vals[int(np.argmin(np.abs(logs - t)))] for t in picks})


def equal_loss_ratios(ref: ArchFit, other: ArchFit, quantity: str) -> list[Ratio]:
    """Ratios `v_B / v_A` at each trained value of `other` (B) against `ref` (A), with intervals."""
    if quantity not in ref.form.variables:
        raise ValueError(f"the {ref.form.name} form has no {quantity} term")
    fixed = {}
    for var in ref.form.variables:
        if var != quantity:
            fixed[var] = max(getattr(p, var) for p in other.points)
    m = min(len(ref.boot_theta), len(other.boot_theta))
    lo_a, hi_a = ref.ranges[quantity]
    q = [50 * (1 - ref.level), 50 * (1 + ref.level)]
    out = []
    for v_b in _trained_values(other, quantity):
        at = {quantity: v_b, **fixed}
        target = float(other.predict(**at)[0])
        v_a = float(_solve(ref, ref.theta, quantity, np.array([target]), fixed)[0])
        if math.isnan(v_a):
            status = "no solution"
        elif v_a < lo_a * (1 - RANGE_RTOL) or v_a > hi_a * (1 + RANGE_RTOL):
            status = "extrapolated"
        else:
            status = "interpolated"
        if ref.at_bound or other.at_bound:
            status = "at bound"
        lo = hi = math.nan
        n_none = 0
        if m > 0:
            targets = predict_theta(other.boot_theta[:m], other.centred(**at))[:, 0]
            v_boot = _solve(ref, ref.boot_theta[:m], quantity, targets, fixed)
            n_none = int(np.isnan(v_boot).sum())
            r_boot = np.where(np.isnan(v_boot), 0.0, v_b / v_boot)  # no solution: A needs "infinitely many"
            lo, hi = (float(t) for t in np.percentile(r_boot, q))
        out.append(
            Ratio(
                reference=ref.arch,
                arch=other.arch,
                quantity=quantity,
                at=v_b,
                fixed=fixed,
                target_loss=target,
                matched=v_a,
                ratio=v_b / v_a if not math.isnan(v_a) else math.nan,
                lo=lo,
                hi=hi,
                status=status,
                n_boot=m,
                n_boot_no_solution=n_none,
                level=ref.level,
            )
        )
    return out
