"""Fit one architecture's points and bootstrap over its runs.

Bootstrap: draw the arch's runs with replacement (a run's checkpoints travel together), refit, and take
percentile intervals of every public parameter. A draw is a weight vector (how often each point's run was
drawn), so no data is copied. Draws that leave a form unidentifiable (fewer than 3 distinct values of a
variable, or fewer distinct design points than parameters) are redrawn and counted in `n_redrawn`: their
fits are arbitrary, not uncertain. All draws are made up front from the seed, so the result does not
depend on how many worker processes refit them.

Paired (`paired=True`, a size x budget grid): the runs are seeds, and every arch draws from ONE stream, so
draw b resamples the same seeds for every arch (seed k of each arch shares its data order and
initialisation); equal-loss ratios then take arch A's and arch B's refits of the same draw. A draw is a
multiset of seeds (3 seeds: 10 distinct ones), and each distinct one is refitted once.

A fit with a parameter at a bound of the optimiser (`at_bound`) is not a minimum of the objective inside
the allowed region: its values are flagged, and ratios from it are not quoted (ablate.fitting.ratios).
"""

from __future__ import annotations

import math
import multiprocessing
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ablate.core.errors import UserError

from .forms import EXPONENT_BOUNDS, LOGCOEF_BOUNDS, Form, predict_theta, theta_to_params
from .optimize import fit_theta, ranked_grid, single_blas_thread
from .points import Point

MIN_DISTINCT = 3  # distinct values per variable: E, coefficient and exponent need three levels
MAX_REDRAWS = 100
BOUND_RTOL = 1e-6  # a parameter within this fraction of its allowed range from a bound is at the bound


@dataclass
class ArchFit:
    """The fit of one architecture: public parameters, percentile intervals, and what they rest on."""

    arch: str
    form: Form
    params: dict[str, float]
    ci: dict[str, tuple[float, float]]
    n_points: int
    n_runs: int
    ranges: dict[str, tuple[float, float]]  # trained range of each variable of the form
    objective: float
    converged: bool  # the optimiser stopped on its tolerance (not on maxiter)
    n_boot: int
    n_redrawn: int
    level: float
    notes: list[str] = field(default_factory=list)
    at_bound: list[str] = field(default_factory=list)  # e.g. ["E = 0 (lower bound)"]; empty: an interior fit
    theta: np.ndarray = field(default=None, repr=False)
    centre: np.ndarray = field(default=None, repr=False)
    boot_theta: np.ndarray = field(default=None, repr=False)  # (n_boot, P), internal parameterisation
    points: list[Point] = field(default_factory=list, repr=False)

    def centred(self, **values: np.ndarray | float) -> np.ndarray:
        """Centred log-variables (K, n) for this form from keyword arrays params=..., tokens=...."""
        rows = []
        for k, var in enumerate(self.form.variables):
            if var not in values or values[var] is None:
                raise ValueError(f"the {self.form.name} form needs {var}=")
            rows.append(np.log(np.atleast_1d(np.asarray(values[var], dtype=float))) - self.centre[k])
        return np.vstack(np.broadcast_arrays(*rows))

    def predict(self, **values: np.ndarray | float) -> np.ndarray:
        """Fitted loss at params=N and/or tokens=D (whichever the form has)."""
        return predict_theta(self.theta, self.centred(**values))

    def predict_band(self, level: float | None = None, **values) -> tuple[np.ndarray, np.ndarray]:
        """Pointwise bootstrap percentile band of the predicted loss (NaN without a bootstrap)."""
        level = self.level if level is None else level
        x = self.centred(**values)
        if self.boot_theta is None or len(self.boot_theta) == 0:
            nan = np.full(x.shape[1], np.nan)
            return nan, nan.copy()
        pred = predict_theta(self.boot_theta, x)
        q = [50 * (1 - level), 50 * (1 + level)]
        lo, hi = np.percentile(pred, q, axis=0)
        return lo, hi


def _design(form: Form, pts: list[Point]) -> tuple[np.ndarray, np.ndarray]:
    """Log-variables (K, n) and losses (n) of the points."""
    logv = np.array([[math.log(getattr(p, v)) for p in pts] for v in form.variables])
    return logv, np.array([p.loss for p in pts])


def _identifiable(form: Form, logv: np.ndarray, mask: np.ndarray) -> bool:
    sub = logv[:, mask]
    if any(np.unique(row).size < MIN_DISTINCT for row in sub):
        return False
    return np.unique(sub.T, axis=0).shape[0] >= form.n_params


def bounds_hit(form: Form, theta: np.ndarray, e_max: float) -> list[str]:
    """The parameters of `theta` at a bound of `fit_theta`'s box, as readable phrases."""
    boxes = [("E", (0.0, e_max))]
    for cn, en in zip(form.coef_names, form.exp_names):
        boxes += [(f"log {cn} (centred)", LOGCOEF_BOUNDS), (en, EXPONENT_BOUNDS)]
    out = []
    for (name, (lo, hi)), value in zip(boxes, theta):
        tol = BOUND_RTOL * (hi - lo)
        if value <= lo + tol:
            out.append(f"{name} = {lo:g} (lower bound)")
        elif value >= hi - tol:
            out.append(f"{name} = {hi:.4g} (upper bound{': the smallest loss' if name == 'E' else ''})")
    return out


def check_points(form: Form, arch: str, pts: list[Point]) -> None:
    """UserError (one line) when the form cannot be fitted to these points."""
    if len(pts) < form.n_params:
        raise UserError(
            f"fit: arch '{arch}' has {len(pts)} points; the {form.name} form ({form.formula}) has "
            f"{form.n_params} parameters and needs at least {form.n_params} points"
        )
    for var in form.variables:
        distinct = len({getattr(p, var) for p in pts})
        if distinct < MIN_DISTINCT:
            raise UserError(
                f"fit: arch '{arch}' has {distinct} distinct {var} values; the {form.name} form needs at "
                f"least {MIN_DISTINCT} to separate E from the {var} term"
            )
    if form.name == "joint":
        logv, _ = _design(form, pts)
        if not _identifiable(form, logv, np.ones(len(pts), bool)):
            raise UserError(
                f"fit: arch '{arch}' has fewer than {form.n_params} distinct (params, tokens) pairs; "
                "the joint form needs at least 5"
            )


def _arch_rng(seed: int, arch: str) -> np.random.Generator:
    # Per-arch stream: adding or removing another arch leaves this arch's draws unchanged.
    return np.random.default_rng(np.random.SeedSequence([int(seed), zlib.crc32(arch.encode())]))


def draw_weights(
    form: Form, logv: np.ndarray, run_index: np.ndarray, n_boot: int, rng: np.random.Generator
) -> tuple[np.ndarray, int]:
    """(n_boot, n_points) bootstrap multiplicities from resampling runs; and how many draws were redone."""
    n_runs = int(run_index.max()) + 1
    out = np.zeros((n_boot, run_index.size))
    redrawn = 0
    for b in range(n_boot):
        for _ in range(MAX_REDRAWS):
            counts = np.bincount(rng.integers(0, n_runs, n_runs), minlength=n_runs)
            w = counts[run_index].astype(float)
            if _identifiable(form, logv, w > 0):
                break
            redrawn += 1
        out[b] = w
    return out, redrawn


def _refit_chunk(x: np.ndarray, loss: np.ndarray, weights: np.ndarray, starts: np.ndarray) -> np.ndarray:
    with single_blas_thread():
        distinct, back = np.unique(weights, axis=0, return_inverse=True)  # few seeds: few distinct draws
        fits = np.array([fit_theta(x, loss, w, n_starts=0, extra_starts=starts)[0] for w in distinct])
        return fits[np.asarray(back).ravel()]


def refit_all(
    x: np.ndarray, loss: np.ndarray, weights: np.ndarray, starts: np.ndarray, n_jobs: int
) -> np.ndarray:
    """Refit every weight vector from `starts`; a spawn-context process pool when n_jobs > 1.

    Results come back in draw order whatever the number of processes. Serial is the default: a refit takes
    ~5-10 ms, so 1000 resamples of a 250-point joint fit take ~10 s, and starting spawned workers costs
    ~1.5 s and helps only on an idle machine (on this shared 2-core machine 2 workers were slower). Spawn
    also needs an importable `__main__` (not a script read from stdin).
    """
    if n_jobs <= 1 or len(weights) < 2 * n_jobs:
        return _refit_chunk(x, loss, weights, starts)
    chunks = np.array_split(weights, 4 * n_jobs)
    # spawn, not fork: the caller may hold threads (MLflow, BLAS) that fork would copy mid-lock.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=n_jobs, mp_context=ctx) as pool:
        parts = list(pool.map(_refit_chunk, *zip(*[(x, loss, c, starts) for c in chunks])))
    return np.concatenate(parts)


def e_bound(e: float, min_loss: float, rtol: float = 1e-3) -> str:
    """Which bound of E's range [0, min L] the fitted E sits at ("lower bound 0", "upper bound min L"), or ""."""
    if e <= rtol * min_loss:
        return "lower bound 0"
    if e >= (1 - rtol) * min_loss:
        return "upper bound, the smallest loss"
    return ""


def fit_arch(
    form: Form,
    arch: str,
    pts: list[Point],
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    n_jobs: int = 1,
    paired: bool = False,
) -> ArchFit:
    """Fit `form` to one architecture's points and bootstrap it over runs (`n_jobs` processes).

    `paired`: the draws come from one stream shared by every arch (see the module doc)."""
    check_points(form, arch, pts)
    logv, loss = _design(form, pts)
    centre = logv.mean(axis=1)
    x = logv - centre[:, None]
    with single_blas_thread():
        theta, fun, ok = fit_theta(x, loss, n_starts=6)
        # Resamples start from the full-data optimum and the two best full-data grid points: a resample
        # is close to the data, and re-ranking the grid per resample cost half of each refit.
        boot_starts = np.vstack([theta, ranked_grid(x, loss, np.ones_like(loss), 2)])

    runs = sorted({p.run_id for p in pts})
    run_of = {r: i for i, r in enumerate(runs)}
    run_index = np.array([run_of[p.run_id] for p in pts])
    if n_boot > 0:
        rng = _arch_rng(seed, "" if paired else arch)
        weights, redrawn = draw_weights(form, logv, run_index, n_boot, rng)
        boot = refit_all(x, loss, weights, boot_starts, n_jobs)
        ci = _percentile_intervals(form, boot, centre, level)
        notes = _bootstrap_notes(redrawn, len(runs))
    else:
        boot, redrawn, notes = np.empty((0, theta.size)), 0, []
        ci = {name: (math.nan, math.nan) for name in form.param_names}
    notes += _data_notes(form, pts, run_index, float(theta[0]), float(loss.min()))

    return ArchFit(
        arch=arch,
        form=form,
        params=theta_to_params(form, theta, centre),
        ci=ci,
        n_points=len(pts),
        n_runs=len(runs),
        ranges={
            v: (min(getattr(p, v) for p in pts), max(getattr(p, v) for p in pts)) for v in form.variables
        },
        objective=fun,
        converged=ok,
        n_boot=int(boot.shape[0]),
        n_redrawn=redrawn,
        level=level,
        notes=notes,
        at_bound=bounds_hit(form, theta, float(loss.min())),
        theta=theta,
        centre=centre,
        boot_theta=boot,
        points=list(pts),
    )


def _percentile_intervals(
    form: Form, boot: np.ndarray, centre: np.ndarray, level: float
) -> dict[str, tuple[float, float]]:
    """Each parameter's percentile interval at `level` over the bootstrap's refits."""
    pub = [theta_to_params(form, t, centre) for t in boot]
    q = [50 * (1 - level), 50 * (1 + level)]
    ci = {}
    for name in form.param_names:
        lo, hi = np.percentile([p[name] for p in pub], q)
        ci[name] = (float(lo), float(hi))
    return ci


def _bootstrap_notes(redrawn: int, n_runs: int) -> list[str]:
    notes = []
    if redrawn:
        notes.append(
            f"{redrawn} bootstrap draws left the form unidentifiable (fewer than {MIN_DISTINCT} distinct "
            "values of a variable, or fewer distinct points than parameters) and were redrawn"
        )
    if n_runs < 10:
        notes.append(f"only {n_runs} runs: bootstrap intervals over so few runs are rough")
    return notes


def _data_notes(form: Form, pts: list[Point], run_index: np.ndarray, e: float, lowest: float) -> list[str]:
    """What the points themselves say about the fit: checkpoints of one run counted as points, variables
    the form ignores, and an irreducible loss `e` at its bound (`lowest`: the lowest loss)."""
    notes = []
    per_run = np.bincount(run_index)
    if "tokens" in form.variables and per_run.max() > 1:
        notes.append(
            f"{int((per_run > 1).sum())} of {len(per_run)} runs contribute several checkpoints: a checkpoint "
            "inside a run is not a separate run at that token budget (its LR schedule differs); the "
            "bootstrap resamples whole runs"
        )
    for var in ("params", "tokens"):
        if var not in form.variables and len({getattr(p, var) for p in pts}) > 1:
            notes.append(f"points differ in {var}, which the {form.name} form ignores")
    if bound := e_bound(e, lowest):
        notes.append(
            f"E sits at its {bound} (E = {e:.4g}): the points do not pin the irreducible loss, so the "
            "fit's values beyond them follow from the bound, not the data; do not quote its extrapolations"
        )
    return notes
