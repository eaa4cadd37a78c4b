"""The size x budget grid fit (ablate.report.scaling, ablate.fitting paired bootstrap) on synthetic grids
generated here from laws written in closed form: exponents recovered within their intervals, the
equal-loss ratios' truth (solved here) inside their paired intervals, bounds flagged, convergence stated."""

from __future__ import annotations

import csv
import datetime
import math
from types import SimpleNamespace

import numpy as np
import pytest

from ablate.fitting import Point, fit_points
from ablate.report.scaling import convergence, grid_fits, write_grid_report

SIZES = np.geomspace(1e5, 1.6e6, 4)  # N: 16x, as the cpu scale's 98K-1.54M
BUDGETS = 524288 * 2.0 ** np.arange(4)  # D: 8x, 0.5M-4.2M tokens
E, A, ALPHA, B, BETA = 1.2, 60.0, 0.3, 80.0, 0.3
KAPPA_N, KAPPA_D = 0.62, 0.65  # Diff's law is the Transformer's at N / KAPPA_N and D / KAPPA_D


def transformer(n, d):
    return E + A * np.asarray(n, float) ** -ALPHA + B * np.asarray(d, float) ** -BETA


def diff(n, d):
    return transformer(np.asarray(n, float) / KAPPA_N, np.asarray(d, float) / KAPPA_D)


def grid_runs(seeds=4, seed_noise=0.004, point_noise=0.002, laws=None, rng_seed=0):
    """One run per (arch, size, seed, budget); seed k shifts both arms alike (paired), plus point noise."""
    rng = np.random.default_rng(rng_seed)
    laws = laws or {"transformer": transformer, "diff": diff}
    shift = rng.normal(0.0, seed_noise, seeds)
    runs = []
    for arch, law in laws.items():
        for i, n in enumerate(SIZES):
            for s in range(seeds):
                family = f"{arch}-{i}-{s}"
                for d in BUDGETS:
                    noise = math.exp(shift[s] + rng.normal(0.0, point_noise)) if seeds else 1.0
                    run_id = family if d == BUDGETS[-1] else f"{family}-{int(d)}"
                    runs.append(
                        SimpleNamespace(
                            arch=arch,
                            size=f"s{i}",
                            seed=s,
                            params=float(n),
                            tokens=float(d),
                            loss=float(law(n, d) * noise),
                            run_id=run_id,
                            family=family,
                            split_tokens=4.0 * BUDGETS[-1],  # every budget under one pass
                            passes=float(d) / (4.0 * BUDGETS[-1]),
                            sampling="permutation",  # windows without replacement (data.sampling)
                        )
                    )
    return runs


def true_params_ratio(n_diff: float, d: float) -> float:
    """Diff at (n_diff, d) reaches L*; the Transformer at the same d needs N' with A N'^-alpha = L* - E - B d^-beta."""
    target = float(diff(n_diff, d))
    n_ref = ((target - E - B * d**-BETA) / A) ** (-1 / ALPHA)
    return n_diff / n_ref


def true_tokens_ratio(d_diff: float, n: float) -> float:
    target = float(diff(n, d_diff))
    d_ref = ((target - E - A * n**-ALPHA) / B) ** (-1 / BETA)
    return d_diff / d_ref


def test_noise_free_grid_recovers_exponents_and_ratios_exactly():
    fits, where = grid_fits(grid_runs(seeds=1, seed_noise=0, point_noise=0), "transformer", 0, 0)
    joint = fits["joint"].archs
    for arch in ("transformer", "diff"):
        assert joint[arch].params["alpha"] == pytest.approx(ALPHA, rel=1e-4)
        assert joint[arch].params["beta"] == pytest.approx(BETA, rel=1e-4)
        assert joint[arch].at_bound == []
    assert fits["size"].archs["diff"].params["alpha"] == pytest.approx(ALPHA, rel=1e-4)
    assert fits["tokens"].archs["diff"].params["beta"] == pytest.approx(BETA, rel=1e-4)
    assert where["largest_tokens"] == BUDGETS[-1] and where["largest_size"] == "s3"
    ratios = {(r.quantity, r.at): r for r in fits["joint"].ratios}
    n_top, d_top = SIZES[-1], BUDGETS[-1]
    assert ratios[("params", n_top)].ratio == pytest.approx(true_params_ratio(n_top, d_top), rel=1e-3)
    assert ratios[("tokens", d_top)].ratio == pytest.approx(true_tokens_ratio(d_top, n_top), rel=1e-3)


def test_noisy_grid_exponents_and_ratios_lie_in_their_paired_seed_intervals():
    fits, _ = grid_fits(grid_runs(), "transformer", n_boot=200, seed=0)
    for arch, f in fits["joint"].archs.items():
        for name, truth in (("alpha", ALPHA), ("beta", BETA)):
            lo, hi = f.ci[name]
            assert lo <= truth <= hi, (arch, name, lo, truth, hi)
            assert hi - lo < 0.5 * truth  # an interval, not the whole allowed range
    lo, hi = fits["size"].archs["transformer"].ci["alpha"]
    assert lo <= ALPHA <= hi
    lo, hi = fits["tokens"].archs["diff"].ci["beta"]
    assert lo <= BETA <= hi
    n_top, d_top = SIZES[-1], BUDGETS[-1]
    ratios = {(r.quantity, r.at): r for r in fits["joint"].ratios}
    for (quantity, at), truth in {
        ("params", n_top): true_params_ratio(n_top, d_top),
        ("tokens", d_top): true_tokens_ratio(d_top, n_top),
    }.items():
        r = ratios[(quantity, at)]
        assert r.status in ("interpolated", "extrapolated") and r.n_boot == 200
        assert r.lo <= truth <= r.hi, (quantity, r.lo, truth, r.hi)


def test_the_bootstrap_draws_the_same_seeds_for_both_arms():
    # Both arms the same numbers: paired, every draw refits identical data, so every ratio is exactly 1;
    # arms resampled independently would spread it.
    runs = grid_runs(laws={"transformer": transformer, "diff": transformer}, rng_seed=3)
    by_arch = {}
    for r in runs:
        by_arch.setdefault(r.arch, []).append(r)
    for a, b in zip(by_arch["transformer"], by_arch["diff"]):
        b.loss = a.loss
    fits, _ = grid_fits(runs, "transformer", n_boot=50, seed=1)
    for r in fits["joint"].ratios:
        assert (r.lo, r.ratio, r.hi) == pytest.approx((1.0, 1.0, 1.0), rel=1e-6)
    unpaired = fit_points(
        [Point(r.arch, r.params, r.tokens, r.loss, f"seed {r.seed}") for r in runs],
        "joint",
        n_boot=50,
        seed=1,
    )
    assert any(r.hi - r.lo > 1e-3 for r in unpaired.ratios)


def test_a_fit_at_a_bound_is_flagged_and_its_ratios_not_quoted(tmp_path):
    def no_floor(n, d):  # E = 0: the fitted E sits on its lower bound
        return A * np.asarray(n, float) ** -ALPHA + B * np.asarray(d, float) ** -BETA

    runs = grid_runs(seeds=2, seed_noise=0, point_noise=0, laws={"transformer": no_floor, "diff": diff})
    ctx = SimpleNamespace(recipe=SimpleNamespace(name="grid", path="recipes/grid.yaml"), scale="cpu")
    t0 = datetime.datetime(2026, 1, 1)
    spans = [(t0, t0 + datetime.timedelta(minutes=30))]
    seconds = {r.run_id: 100.0 if r.run_id == r.family else 20.0 for r in runs}
    _, fits, _ = write_grid_report(
        ctx,
        runs,
        "transformer",
        tmp_path,
        spans=spans,
        seconds=seconds,
        n_boot=20,
        seed=0,
        params_word="non-embedding parameters",
        notes=[],
    )
    assert any(b.startswith("E = 0 (lower bound)") for b in fits["joint"].archs["transformer"].at_bound)
    rows = list(csv.DictReader(open(tmp_path / "ratios.csv")))
    joint = [r for r in rows if r["fit"] == "joint"]
    assert (
        joint and {r["status"] for r in joint} == {"at bound"} and {r["quoted"] for r in joint} == {"False"}
    )
    readme = (tmp_path / "README.md").read_text()
    assert "not quoted (at bound)" in readme and "E = 0 (lower bound)" in readme
    (grid,) = list(csv.DictReader(open(tmp_path / "grid.csv")))
    # 16 families x 100 s trained from step 0, 48 branches x 20 s; separately: 100 s x (1+2+4+8)/8 each
    assert float(grid["grid_train_minutes"]) == pytest.approx((16 * 100 + 48 * 20) / 60, abs=0.05)
    assert float(grid["separate_runs_train_minutes_estimated"]) == pytest.approx(
        16 * 100 * 15 / 8 / 60, abs=0.05
    )
    assert f"{grid['grid_over_separate']}x" in readme and f"{grid['wall_clock_minutes']} min" in readme


def test_every_points_convergence_measured_against_its_next_budget_or_fitted_at_the_largest():
    runs = grid_runs(seeds=1, seed_noise=0, point_noise=0)
    conv = convergence(runs)
    for r in runs:
        c = conv[r.run_id]
        law = transformer if r.arch == "transformer" else diff
        truth = float((law(r.params, r.tokens) - law(r.params, 2 * r.tokens)) / law(r.params, r.tokens))
        assert c["gain_source"] == ("fitted" if r.tokens == BUDGETS[-1] else "measured")
        # the family's budgets lie on E' + B' D^-beta exactly, so the fitted gain is the law's too
        assert c["gain_2x_tokens"] == pytest.approx(truth, rel=1e-3)
        assert c["converged"] == (truth < 0.01)
