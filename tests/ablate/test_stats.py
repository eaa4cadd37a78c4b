"""ablate.report.stats against hand-computed intervals and simulations with known answers."""

import math

import numpy as np
import pytest
from scipy import stats as st

from ablate.report.stats import (
    Interval,
    PairedDiff,
    format_ci,
    format_diff,
    format_pm,
    mean_ci,
    paired_difference,
)


def test_mean_ci_matches_hand_computed_t_interval():
    # 3.060, 3.062, 3.064: mean 3.062, sample sd 0.002, se = 0.002/sqrt(3), t_{0.975, df=2} = 4.302653
    iv = mean_ci([3.060, 3.062, 3.064])
    half = 4.302652729911275 * 0.002 / math.sqrt(3)  # = 0.0049683
    assert iv.n == 3 and iv.n_excluded == 0
    assert iv.mean == pytest.approx(3.062, abs=1e-12)
    assert iv.lo == pytest.approx(3.062 - half, abs=1e-9)
    assert iv.hi == pytest.approx(3.062 + half, abs=1e-9)
    assert iv.half_width == pytest.approx(0.0049683, abs=1e-7)


def test_mean_ci_other_level_from_scipy_quantile():
    x = np.array([1.0, 2.0, 4.0, 7.0, 11.0])
    iv = mean_ci(x, level=0.9)
    m = x.sum() / 5
    s = math.sqrt(((x - m) ** 2).sum() / 4)
    half = st.t.ppf(0.95, 4) * s / math.sqrt(5)
    assert (iv.mean, iv.lo, iv.hi) == pytest.approx((m, m - half, m + half), abs=1e-12)
    assert iv.level == 0.9


def test_nan_runs_are_excluded_and_counted():
    iv = mean_ci([3.0, float("nan"), 3.2, float("nan"), 3.4])
    ref = mean_ci([3.0, 3.2, 3.4])
    assert iv.n == 3 and iv.n_excluded == 2
    assert (iv.mean, iv.lo, iv.hi) == (ref.mean, ref.lo, ref.hi)


def test_single_value_has_no_interval_and_says_so():
    iv = mean_ci([3.062, float("nan")])
    assert iv.n == 1 and iv.n_excluded == 1 and iv.mean == 3.062
    assert math.isnan(iv.lo) and math.isnan(iv.hi)
    assert iv.note == "n=1, no interval"
    assert format_pm(iv) == "3.062 (n=1, no interval)"
    empty = mean_ci([float("nan")])
    assert empty.n == 0 and math.isnan(empty.mean) and empty.note == "no finished runs"


def test_t_interval_coverage_is_nominal():
    # 2000 normal samples of size 5: the 95% interval should cover the mean ~95% of the time;
    # binomial sd at 2000 sims is 0.005, so [0.93, 0.97] is +-4 sd.
    rng = np.random.default_rng(123)
    hits = 0
    for _ in range(2000):
        iv = mean_ci(rng.normal(3.0, 0.02, size=5))
        hits += iv.lo <= 3.0 <= iv.hi
    assert 0.93 <= hits / 2000 <= 0.97


def test_paired_difference_pairs_on_common_seeds():
    a = {0: 3.10, 1: 3.12, 2: 3.09, 5: 3.00}
    b = {1: 3.13, 2: 3.11, 0: 3.12, 7: 9.99}
    d = paired_difference(a, b)
    diffs = np.array([3.10 - 3.12, 3.12 - 3.13, 3.09 - 3.11])
    m, s = diffs.mean(), diffs.std(ddof=1)
    half = st.t.ppf(0.975, 2) * s / math.sqrt(3)
    p = 2 * st.t.sf(abs(m) / (s / math.sqrt(3)), 2)
    assert isinstance(d, PairedDiff)
    assert d.n == 3 and set(d.unpaired) == {5, 7}
    assert (d.mean, d.lo, d.hi) == pytest.approx((m, m - half, m + half), abs=1e-12)
    assert d.p_value == pytest.approx(p, rel=1e-9)
    assert d.significant == (m + half < 0 or m - half > 0)


def test_paired_difference_nan_seed_is_dropped_and_counted():
    d = paired_difference({0: 1.0, 1: float("nan"), 2: 1.2, 3: 1.1}, {0: 0.9, 1: 1.0, 2: 1.0, 3: 1.0})
    assert d.n == 3 and d.n_excluded == 1


def test_paired_difference_says_how_much_one_seed_moves_it():
    rng = np.random.default_rng()
    a = {seed: float(v) for seed, v in enumerate(rng.normal(3.8, 0.05, size=6))}
    b = {seed: float(v) for seed, v in enumerate(rng.normal(3.75, 0.05, size=6))}
    d = paired_difference(a | {9: 1.0}, b)  # seed 9 has no pair and counts in no spread
    per_seed = [a[s] - b[s] for s in range(6)]  # by hand, in float64
    mean = sum(per_seed) / 6
    sd = math.sqrt(sum((x - mean) ** 2 for x in per_seed) / 5)
    assert d.sd == pytest.approx(sd, rel=1e-12)
    assert d.smallest == min(per_seed) and d.largest == max(per_seed)
    one = paired_difference({0: 3.0}, {0: 2.5})
    assert math.isnan(one.sd) and one.smallest == one.largest == 0.5


def test_paired_difference_with_one_pair_is_not_significant():
    d = paired_difference({0: 3.0, 1: 3.1}, {0: 2.0})
    assert d.n == 1 and not d.significant
    assert math.isnan(d.lo) and math.isnan(d.hi) and math.isnan(d.p_value)
    assert format_diff(d) == "+1.000 (n=1, no interval)"


def test_paired_test_detects_a_known_shift():
    # Seed effects (sd 0.02) shared by both arms cancel in the pairing; a -0.025 shift with pair noise
    # sd 0.005 over 5 seeds has t ~ -11: missed with probability ~1e-4.
    rng = np.random.default_rng(7)
    seeds = range(5)
    base = {s: 3.1 + rng.normal(0, 0.02) for s in seeds}
    a = {s: base[s] - 0.025 + rng.normal(0, 0.0035) for s in seeds}
    b = {s: base[s] + rng.normal(0, 0.0035) for s in seeds}
    d = paired_difference(a, b)
    assert d.significant and d.hi < 0 and d.p_value < 0.01
    assert d.lo < -0.025 < d.hi
    # The same numbers unpaired (independent-sample view) are swamped by the seed effects.
    assert mean_ci(list(a.values())).hi > mean_ci(list(b.values())).lo


def test_paired_test_false_positive_rate_at_zero_shift():
    # No shift: "significant" should happen ~5% of the time; 1000 sims, binomial sd 0.7%, so < 8%.
    rng = np.random.default_rng(11)
    flagged = 0
    for _ in range(1000):
        base = rng.normal(3.1, 0.02, size=6)
        a = dict(enumerate(base + rng.normal(0, 0.005, 6)))
        b = dict(enumerate(base + rng.normal(0, 0.005, 6)))
        flagged += paired_difference(a, b).significant
    assert 0.02 <= flagged / 1000 < 0.08


def test_significant_iff_interval_excludes_zero():
    rng = np.random.default_rng(3)
    for _ in range(200):
        a = dict(enumerate(rng.normal(0.0, 1.0, 4)))
        b = dict(enumerate(rng.normal(0.5, 1.0, 4)))
        d = paired_difference(a, b)
        assert d.significant == (not (d.lo <= 0.0 <= d.hi))
        assert d.significant == (d.p_value < 0.05)  # equivalent for the t-test at the same level


def test_identical_differences_have_zero_width():
    d = paired_difference({0: 2.0, 1: 3.0}, {0: 1.5, 1: 2.5})
    assert d.mean == pytest.approx(0.5) and d.lo == pytest.approx(0.5) and d.hi == pytest.approx(0.5)
    assert d.significant and d.p_value == 0.0


def test_formatting():
    iv = Interval(mean=3.062, lo=3.058, hi=3.066, n=3)
    assert format_pm(iv) == "3.062 \u00b1 0.004"
    assert format_ci(iv) == "3.062 [3.058, 3.066]"
    d = PairedDiff(mean=-0.025, lo=-0.031, hi=-0.019, n=5, p_value=0.001, significant=True)
    assert format_diff(d) == "\u22120.025 [\u22120.031, \u22120.019] *"
    d2 = PairedDiff(mean=0.017, lo=-0.002, hi=0.036, n=5, p_value=0.08, significant=False)
    assert format_diff(d2) == "+0.017 [\u22120.002, 0.036]"
    assert format_ci(Interval(-0.0001, -0.0002, 0.0001, 2)) == "0.000 [0.000, 0.000]"  # no "−0.000"


def test_paired_difference_rejects_sequences():
    with pytest.raises(TypeError, match="mappings seed -> value"):
        paired_difference([1.0, 2.0], [1.0, 2.0])


def test_holm_on_a_hand_worked_family_and_against_adjusted_p_values():
    from ablate.report.stats import holm

    # sorted: 0.005 <= .05/4, 0.01 <= .05/3, 0.03 > .05/2: stop; NaN is no test and not in the family
    assert holm([0.01, 0.04, 0.03, 0.005, float("nan")]) == [True, False, False, True, False]
    rng = np.random.default_rng(0)
    for _ in range(500):
        p = list(rng.uniform(0, 0.08, size=rng.integers(1, 8)))
        order = np.argsort(p)
        m = len(p)
        adjusted = np.maximum.accumulate([min(1.0, (m - j) * p[i]) for j, i in enumerate(order)])
        expected = [False] * m
        for j, i in enumerate(order):
            expected[i] = bool(adjusted[j] <= 0.05)
        assert holm(p) == expected, p


def test_p_values_say_no_more_than_three_decimals():
    from ablate.report.stats import format_p

    assert (format_p(0.00046), format_p(0.0012), format_p(0.5), format_p(float("nan"))) == (
        "p<0.001",
        "p=0.001",
        "p=0.500",
        "p=n/a",
    )
