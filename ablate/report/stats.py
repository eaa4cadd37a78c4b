"""Honest statistics over seeds: Student-t intervals and paired differences (for the Table 6 report).

Small-scale replications are noisy (seed noise can be as large as the Diff-vs-Transformer effect),
so every number in a report carries its interval and every comparison is paired by seed.

Failed runs arrive as NaN: they are left out of the statistics and counted, never silently averaged.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

MINUS = "\u2212"  # typographic minus for tables: "−0.025"


@dataclass(frozen=True)
class Interval:
    """Mean over seeds with a two-sided Student-t interval; `lo`/`hi` are NaN when `n < 2`."""

    mean: float
    lo: float
    hi: float
    n: int  # finite values used
    n_excluded: int = 0  # NaN / inf inputs (failed runs) left out
    level: float = 0.95

    @property
    def half_width(self) -> float:
        return self.hi - self.mean

    @property
    def note(self) -> str:
        """Why there is no interval ('' when there is one)."""
        if self.n == 0:
            return "no finished runs"
        if self.n == 1:
            return "n=1, no interval"
        return ""


@dataclass(frozen=True)
class PairedDiff:
    """Mean of `a[seed] - b[seed]` over common seeds with a paired-t interval and p-value."""

    mean: float
    lo: float
    hi: float
    n: int  # seeds paired (both values finite)
    p_value: float
    significant: bool  # the interval excludes 0 (never with n < 2)
    n_excluded: int = 0  # common seeds dropped because one side is NaN
    unpaired: tuple = ()  # seeds present on one side only
    level: float = 0.95
    sd: float = math.nan  # how much one seed moves it: the per-seed differences' sample standard deviation
    smallest: float = math.nan  # the per-seed differences' smallest and largest
    largest: float = math.nan


def diff_columns(d: PairedDiff | None) -> dict[str, float]:
    """A paired difference as the CSV columns every report uses for it (NaN without one: the first row)."""
    return {
        "diff_vs_first": d.mean if d else math.nan,
        "diff_lo": d.lo if d else math.nan,
        "diff_hi": d.hi if d else math.nan,
        "p_value": d.p_value if d else math.nan,
    }


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")


def _finite(values: Iterable[float]) -> tuple[np.ndarray, int]:
    x = np.asarray([float(v) for v in values], dtype=float)
    ok = np.isfinite(x)
    return x[ok], int((~ok).sum())


def _t_interval(x: np.ndarray, level: float) -> tuple[float, float, float, float]:
    """(mean, lo, hi, standard error) of a one-sample t interval; lo/hi NaN for n < 2."""
    n = x.size
    if n == 0:
        return math.nan, math.nan, math.nan, math.nan
    mean = float(x.mean())
    if n == 1:
        return mean, math.nan, math.nan, math.nan
    se = float(x.std(ddof=1)) / math.sqrt(n)
    half = float(_st.t.ppf(0.5 + level / 2.0, n - 1)) * se
    return mean, mean - half, mean + half, se


def mean_ci(values: Iterable[float], level: float = 0.95) -> Interval:
    """Mean of `values` with a Student-t interval at `level`; NaN values are excluded and counted."""
    _check_level(level)
    x, n_bad = _finite(values)
    mean, lo, hi, _ = _t_interval(x, level)
    return Interval(mean=mean, lo=lo, hi=hi, n=int(x.size), n_excluded=n_bad, level=level)


def bounded_mean_ci(
    values: Iterable[float], lower: float = 0.0, upper: float | None = None, level: float = 0.95
) -> Interval:
    """Mean of a bounded quantity with an interval that stays inside its bounds.

    A Student-t interval for the mean of values in [lower, upper] (an accuracy or a share: [0, 1]) can
    leave the range (accuracies 0.9, 0.6, 0.0 give a lower end of -0.9). Here the t interval is taken on
    the logit scale ([lower, upper]) or the log scale ([lower, inf)) of the values and mapped back, so it
    respects the bounds; values on a bound are moved in by 1e-3 of the range first (the logit of 0 or 1 is
    infinite). The centre stays the arithmetic mean (the interval is widened to hold it if the skew of the
    transform put it outside). With all values equal the interval is that value.
    """
    _check_level(level)
    x, n_bad = _finite(values)
    mean = float(x.mean()) if x.size else math.nan
    if x.size < 2:
        return Interval(mean=mean, lo=math.nan, hi=math.nan, n=int(x.size), n_excluded=n_bad, level=level)
    if upper is None:
        eps = 1e-3 * max(float(np.abs(x - lower).max()), 1e-12)
        z = np.log(np.maximum(x - lower, eps))
        _, lo, hi, _ = _t_interval(z, level)
        lo, hi = lower + math.exp(lo), lower + math.exp(hi)
    else:
        width = upper - lower
        u = np.clip((x - lower) / width, 1e-3, 1 - 1e-3)
        _, lo, hi, _ = _t_interval(np.log(u / (1 - u)), level)
        lo, hi = lower + width / (1 + math.exp(-lo)), lower + width / (1 + math.exp(-hi))
    return Interval(
        mean=mean, lo=min(lo, mean), hi=max(hi, mean), n=int(x.size), n_excluded=n_bad, level=level
    )


def paired_difference(
    a: Mapping[Hashable, float], b: Mapping[Hashable, float], level: float = 0.95
) -> PairedDiff:
    """Paired t-test of `a - b` over the seeds both mappings share (seed -> value).

    Seeds on one side only are reported in `unpaired`; a common seed whose value is NaN on either side
    is dropped and counted in `n_excluded`. `significant` iff the interval excludes 0 (needs n >= 2).
    """
    _check_level(level)
    if not isinstance(a, Mapping) or not isinstance(b, Mapping):
        raise TypeError("paired_difference takes two mappings seed -> value, so seeds can be paired")
    common = [s for s in a if s in b]
    unpaired = tuple(sorted((s for s in set(a) ^ set(b)), key=repr))
    d, n_bad = _finite(float(a[s]) - float(b[s]) for s in common)
    mean, lo, hi, se = _t_interval(d, level)
    n = int(d.size)
    spread = {
        "sd": float(d.std(ddof=1)) if n >= 2 else math.nan,
        "smallest": float(d.min()) if n else math.nan,
        "largest": float(d.max()) if n else math.nan,
    }
    if n < 2:
        return PairedDiff(mean, math.nan, math.nan, n, math.nan, False, n_bad, unpaired, level, **spread)
    if se == 0.0:  # identical differences on every seed: no spread to test against
        p = 1.0 if mean == 0.0 else 0.0
    else:
        p = float(2.0 * _st.t.sf(abs(mean) / se, n - 1))
    significant = bool(lo > 0.0 or hi < 0.0)
    return PairedDiff(mean, lo, hi, n, p, significant, n_bad, unpaired, level, **spread)


def holm(p_values: list[float], alpha: float = 0.05) -> list[bool]:
    """Holm's step-down correction (Holm 1979) over a family of tests: for each p-value, whether its
    null is rejected at family-wise error `alpha`. NaN p-values (no test) are never rejected and do not
    count in the family."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if math.isfinite(p))
    rejected = [False] * len(p_values)
    m = len(tested)
    for rank, (p, i) in enumerate(tested):
        if p > alpha / (m - rank):
            break  # step-down: every larger p-value stays too
        rejected[i] = True
    return rejected


def mark_holm(rows: list[dict], lo: str, hi: str) -> tuple[int, list[dict], list[dict]]:
    """Holm over a family of result rows (each with `p_value` and its interval's bounds under the keys
    `lo`, `hi`): sets each row's `holm_survives` ("true" / "false"; "" without a test) and returns
    (comparisons, the rows whose interval excludes 0, those of them that survive)."""
    tested = [r for r in rows if math.isfinite(r["p_value"])]
    for r in rows:
        r["holm_survives"] = ""
    for r, kept in zip(tested, holm([r["p_value"] for r in tested])):
        r["holm_survives"] = "true" if kept else "false"
    excluding = [r for r in tested if r[lo] > 0 or r[hi] < 0]
    return len(tested), excluding, [r for r in excluding if r["holm_survives"] == "true"]


# ----------------------------------------------------------------------------------- formatting


def format_p(p: float) -> str:
    """'p=0.012', 'p<0.001' (three decimals say no more than that), 'p=n/a' without a test."""
    if not math.isfinite(p):
        return "p=n/a"
    return "p<0.001" if p < 0.001 else f"p={p:.3f}"


def format_number(x: float, digits: int = 3, sign: bool = False) -> str:
    """Fixed-point with a typographic minus; `sign=True` writes '+' on positive numbers."""
    if not math.isfinite(x):
        return "n/a"
    s = f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"
    if float(s.lstrip("+-") or 0) == 0.0:  # "-0.000" reads as a sign that is not there
        s = s.lstrip("+-")
    return s.replace("-", MINUS)


def format_pm(iv: Interval, digits: int = 3) -> str:
    """'3.062 ± 0.004' (half-width of the t interval); says why when there is no interval."""
    if iv.n == 0:
        return "n/a (no finished runs)"
    if iv.n == 1:
        return f"{format_number(iv.mean, digits)} (n=1, no interval)"
    return f"{format_number(iv.mean, digits)} \u00b1 {format_number(iv.half_width, digits)}"


def format_ci(iv: Interval, digits: int = 3) -> str:
    """'3.062 [3.058, 3.066]'; says why when there is no interval."""
    if iv.n < 2:
        return format_pm(iv, digits)
    return (
        f"{format_number(iv.mean, digits)} [{format_number(iv.lo, digits)}, {format_number(iv.hi, digits)}]"
    )


def format_diff(d: PairedDiff, digits: int = 3, star: str = "*") -> str:
    """'−0.025 [−0.031, −0.019] *': signed mean, paired interval, `star` when significant."""
    mean = format_number(d.mean, digits, sign=True)
    if d.n == 0:
        return "n/a (no paired seeds)"
    if d.n == 1:
        return f"{mean} (n=1, no interval)"
    text = f"{mean} [{format_number(d.lo, digits)}, {format_number(d.hi, digits)}]"
    return f"{text} {star}" if d.significant and star else text
