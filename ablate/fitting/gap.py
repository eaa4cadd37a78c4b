"""The gap between two rows' fitted loss curves at a token count, with a paired bootstrap over seeds.

Each row's final losses at several token budgets (one run per budget and seed) are fitted with the
`tokens` form, L(D) = E + B D^-beta (docs/paper.md, "Scaling"; the same Huber objective and
optimiser as `fit_arch`). The gap is row minus reference at `tokens`. The bootstrap draws seeds with
replacement, the same draw for both rows (seed k of every row shares its data order and initialisation),
refits both and takes percentile intervals. With few seeds there are few distinct draws (3 seeds: 10), so
the interval is coarse; callers say how many seeds it rests on. Beyond the largest budget it is an
extrapolation of a three-parameter curve, and says nothing the budgets did not measure.

Why not `fit_arch`'s bootstrap: it draws each architecture's runs independently, which ignores the pairing
by seed that makes a difference between rows precise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .forms import predict_theta
from .optimize import fit_theta, single_blas_thread


@dataclass(frozen=True)
class Gap:
    tokens: float  # where the curves are compared
    estimate: float  # fitted row loss - fitted reference loss there
    lo: float
    hi: float
    n_seeds: int
    n_boot: int


def _fit(tokens: np.ndarray, loss: np.ndarray, weight: np.ndarray, centre: float) -> np.ndarray:
    x = (np.log(tokens) - centre)[None, :]
    return fit_theta(x, loss, weight, n_starts=6)[0]


def fitted_gap(
    reference: dict[int, dict[float, float]],
    row: dict[int, dict[float, float]],
    at_tokens: float,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> Gap:
    """`reference`, `row`: seed -> {tokens: final loss}; seeds both rows have are used."""
    seeds = sorted(set(reference) & set(row))
    if not seeds:
        return Gap(at_tokens, math.nan, math.nan, math.nan, 0, 0)

    def arrays(curves: dict[int, dict[float, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pairs = [(i, t, v) for i, s in enumerate(seeds) for t, v in sorted(curves[s].items())]
        return tuple(np.array(col, dtype=float) for col in zip(*pairs))  # type: ignore[return-value]

    (ref_seed, ref_tokens, ref_loss), (row_seed, row_tokens, row_loss) = arrays(reference), arrays(row)
    centre = float(np.log(np.concatenate([ref_tokens, row_tokens])).mean())
    x_at = np.array([[math.log(at_tokens) - centre]])

    known: dict[tuple[int, ...], float] = {}  # a draw is its seed counts: 3 seeds have 10 distinct ones

    def gap(weights: np.ndarray) -> float:
        key = tuple(int(w) for w in weights)
        if key not in known:
            ref = _fit(ref_tokens, ref_loss, weights[ref_seed.astype(int)], centre)
            mine = _fit(row_tokens, row_loss, weights[row_seed.astype(int)], centre)
            known[key] = float(predict_theta(mine, x_at)[0] - predict_theta(ref, x_at)[0])
        return known[key]

    with single_blas_thread():
        estimate = gap(np.ones(len(seeds)))
        draws = []
        if len(seeds) >= 2 and n_boot > 0:
            rng = np.random.default_rng(seed)
            for _ in range(n_boot):
                draws.append(gap(np.bincount(rng.integers(0, len(seeds), len(seeds)), minlength=len(seeds))))
    if not draws:
        return Gap(at_tokens, estimate, math.nan, math.nan, len(seeds), 0)
    lo, hi = np.percentile(draws, [50 * (1 - level), 50 * (1 + level)])
    return Gap(at_tokens, estimate, float(lo), float(hi), len(seeds), len(draws))
