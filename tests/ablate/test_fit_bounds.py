"""A fit whose irreducible loss E lands on a bound of its range [0, min L] says so in its notes."""

from __future__ import annotations

import numpy as np

from ablate.fitting.core import e_bound, fit_arch
from ablate.fitting.forms import FORMS
from ablate.fitting.points import Point


def _points(losses: dict[float, list[float]]) -> list[Point]:
    return [
        Point("a", 1e6, tokens, loss, f"seed{i}")
        for tokens, per_seed in losses.items()
        for i, loss in enumerate(per_seed)
    ]


def test_a_fit_with_e_at_zero_is_flagged_and_one_inside_is_not():
    rng = np.random.default_rng(1)
    tokens = [2.0**k * 1e5 for k in range(5)]
    # loss falling by a constant factor per doubling: a pure power law, L = A D^-a, whose E is 0
    pure = {t: [6.0 * (t / 1e5) ** -0.08 * (1 + rng.normal(0, 1e-4)) for _ in range(3)] for t in tokens}
    fit = fit_arch(FORMS["tokens"], "a", _points(pure), n_boot=0)
    assert any("E sits at its lower bound 0" in n for n in fit.notes), fit.notes
    # an irreducible loss of 2 nats well inside [0, min L]
    inside = {
        t: [2.0 + 4.0 * (t / 1e5) ** -0.5 * (1 + rng.normal(0, 1e-4)) for _ in range(3)] for t in tokens
    }
    fit = fit_arch(FORMS["tokens"], "a", _points(inside), n_boot=0)
    assert abs(fit.params["E"] - 2.0) < 0.1, fit.params
    assert not any("E sits at" in n for n in fit.notes), fit.notes


def test_e_bound_names_the_bound():
    assert e_bound(0.0, 3.0) == "lower bound 0"
    assert e_bound(2.9999, 3.0) == "upper bound, the smallest loss"
    assert e_bound(1.5, 3.0) == ""
