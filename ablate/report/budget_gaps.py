"""A budgeted study's numbers (ablate.recipe.budgets): each row's paired gap to the reference row at every
token budget, its generalization gap, the change of the gap per doubling of tokens, and its trend.

The change per doubling is the paired change over each doubling: for each seed, (gap at the larger
budget - gap at the smaller) / log2(larger / smaller), the mean over seeds with a Student-t interval, one
per pair of consecutive budgets. Every budget enters it (each inner budget in two doublings), and a gap
that closes ever more slowly shows as a column of shrinking changes. One least-squares slope over
log-evenly spaced budgets would not: over three budgets it is (last - first) / 2, whatever the middle
budget measured, and over more it averages a decelerating change into a rate the last doubling no longer
has. The row's line in `budgets.md` quotes the last doubling (where the gap is going now) and
`doublings.csv` has all.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from ablate.core.tables import si
from ablate.report import stats

EXTRAPOLATE = 10  # the fitted gap is given at this multiple of the largest budget
N_BOOT = 1000


def by_budget(records: list[Any]) -> dict[int, list[Any]]:
    groups: dict[int, list[Any]] = defaultdict(list)
    for r in records:
        groups[r.tokens].append(r)
    return dict(sorted(groups.items()))


def losses(records: list[Any], variant: str, size: str, key: str = "valid") -> dict[int, dict[int, float]]:
    """seed -> {tokens: final validation loss (or `key`: "train", the training loss at the end)} of one
    row's finished runs."""
    out: dict[int, dict[int, float]] = defaultdict(dict)
    for r in records:
        if r.variant == variant and r.size == size and r.state == "finished":
            value = r.values.get(key, math.nan)
            if math.isfinite(value):
                out[r.seed][r.tokens] = value
    return dict(out)


def rows_short_of_budgets(
    order: list[str], records: list[Any], labels: dict[str, str], budgets: list[int]
) -> list[str]:
    """Each row (and size) whose finished runs miss some of `budgets`, with the budgets it has: a row
    added to a study, or one whose extension was not trained."""
    short = []
    for size in sorted({r.size for r in records}):
        for variant in order:
            has = sorted({t for curve in losses(records, variant, size).values() for t in curve})
            if has and set(has) != set(budgets):
                name = labels[variant] + (f" ({size})" if size else "")
                short.append(f"{name} at {', '.join(si(t) for t in has)} only")
    return short


def row_pairs(order: list[str], records: list[Any]) -> Iterator[tuple]:
    """Per size, each row other than the reference (the first row present at that size): (size, reference
    key, its losses, the row's key, its losses, the row's budgets in increasing order)."""
    for size in sorted({r.size for r in records}):
        present = [v for v in order if any(r.variant == v and r.size == size for r in records)]
        if len(present) < 2:
            continue
        ref = losses(records, present[0], size)
        for variant in present[1:]:
            mine = losses(records, variant, size)
            budgets = sorted({t for curve in mine.values() for t in curve})
            yield size, present[0], ref, variant, mine, budgets


def gap_rows(order: list[str], records: list[Any], labels: dict[str, str]) -> list[dict[str, Any]]:
    """Per (size, row other than the reference, budget): the paired difference to the reference row."""
    rows = []
    for size, reference, ref, variant, mine, budgets in row_pairs(order, records):
        mine_train = losses(records, variant, size, "train")
        ref_train = losses(records, reference, size, "train")
        for tokens in budgets:
            diff = stats.paired_difference(
                {s: c[tokens] for s, c in mine.items() if tokens in c},
                {s: c[tokens] for s, c in ref.items() if tokens in c},
            )
            train = stats.paired_difference(
                {s: c[tokens] for s, c in mine_train.items() if tokens in c},
                {s: c[tokens] for s, c in ref_train.items() if tokens in c},
            )
            rows.append(
                {
                    "variant": variant,
                    "label": labels[variant],
                    "reference": reference,
                    "size": size,
                    "tokens": tokens,
                    "passes": budget_passes(records, tokens),
                    "n_seeds": diff.n,
                    "gap": diff.mean,
                    "lo": diff.lo,
                    "hi": diff.hi,
                    "p_value": diff.p_value,
                    "train_gap": train.mean,
                    "train_lo": train.lo,
                    "train_hi": train.hi,
                }
            )
    return rows


def budget_passes(records: list[Any], tokens: int) -> float:
    """Passes over the training split of the runs at this budget (nan when unknown or not one value)."""
    seen = {round(r.passes, 6) for r in records if r.tokens == tokens and math.isfinite(r.passes)}
    return seen.pop() if len(seen) == 1 else math.nan


def generalization_rows(order: list[str], records: list[Any], labels: dict[str, str]) -> list[dict[str, Any]]:
    """Per (size, row, budget): the passes, the training loss at the end, the validation loss, and their
    difference (validation − train: the generalization gap), each a mean over seeds [95% Student-t]."""
    rows = []
    for size in sorted({r.size for r in records}):
        for variant in order:
            valid, train = losses(records, variant, size), losses(records, variant, size, "train")
            for tokens in sorted({t for curve in valid.values() for t in curve}):
                seeds = [s for s in valid if tokens in valid[s] and tokens in train.get(s, {})]
                v = stats.mean_ci([valid[s][tokens] for s in seeds])
                t = stats.mean_ci([train[s][tokens] for s in seeds])
                g = stats.mean_ci([valid[s][tokens] - train[s][tokens] for s in seeds])
                rows.append(
                    {
                        "variant": variant,
                        "label": labels[variant],
                        "size": size,
                        "tokens": tokens,
                        "passes": budget_passes(records, tokens),
                        "n_seeds": len(seeds),
                        "train": t.mean,
                        "valid": v.mean,
                        "valid_minus_train": g.mean,
                        "valid_minus_train_lo": g.lo,
                        "valid_minus_train_hi": g.hi,
                    }
                )
    return rows


def holm_over_budgets(gaps: list[dict[str, Any]]) -> str:
    """Marks each gap row `holm_survives` (Holm's correction over every row at every budget: one family)
    and says how many comparisons that is and which intervals excluding 0 survive it."""
    n, excluding, kept = stats.mark_holm(gaps, "lo", "hi")
    if not n:
        return "No comparison has two seeds: no interval."
    text = (
        f"{n} comparisons (each row against the reference row at each budget, one family); "
        f"{len(kept)} of the {len(excluding)} intervals that exclude 0 survive Holm's correction for "
        f"{n} comparisons at 5% (`holm_survives` in `gap_vs_tokens.csv`)"
    )
    lost = [f"{g['label']} at {si(g['tokens'])}" for g in excluding if g["holm_survives"] != "true"]
    return text + (f"; not: {', '.join(lost)}." if lost else ".")


def doubling_rows(order: list[str], records: list[Any], labels: dict[str, str]) -> list[dict[str, Any]]:
    """Per (size, row other than the reference, pair of consecutive budgets): the paired change of the gap
    per doubling of tokens, mean over seeds [95% Student-t] (module doc: why per doubling)."""
    rows = []
    for size, reference, ref, variant, mine, budgets in row_pairs(order, records):
        for small, large in zip(budgets, budgets[1:]):
            changes = [
                ((mine[s][large] - ref[s][large]) - (mine[s][small] - ref[s][small]))
                / math.log2(large / small)
                for s in sorted(set(mine) & set(ref))
                if all(t in mine[s] and t in ref[s] for t in (small, large))
            ]
            change = stats.mean_ci(changes)
            rows.append(
                {
                    "variant": variant,
                    "label": labels[variant],
                    "reference": reference,
                    "size": size,
                    "from_tokens": small,
                    "to_tokens": large,
                    "n_seeds": change.n,
                    "change_per_doubling": change.mean,
                    "change_lo": change.lo,
                    "change_hi": change.hi,
                }
            )
    return rows


def trend_rows(
    order: list[str], records: list[Any], labels: dict[str, str], doublings: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per row: the change of the gap over the last doubling (of `doublings`), and the fitted gap at
    EXTRAPOLATE x the largest budget (ablate.fitting.gap), with the fits' parameters that sit at a bound
    (`extrapolation_at_bound`: the extrapolation then rests on the constraint, and is not quoted)."""
    from ablate.fitting.gap import fitted_gap
    from ablate.report.predict import bound_flags

    rows = []
    for size, reference, ref, variant, mine, budgets in row_pairs(order, records):
        mine_doublings = [d for d in doublings if d["variant"] == variant and d["size"] == size]
        last = mine_doublings[-1] if mine_doublings else None
        at = EXTRAPOLATE * budgets[-1] if budgets else math.nan
        fitted = fitted_gap(ref, mine, at, n_boot=N_BOOT) if len(budgets) >= 3 else None
        flags = bound_flags(ref, labels[reference]) + bound_flags(mine, labels[variant]) if fitted else []
        rows.append(
            {
                "variant": variant,
                "label": labels[variant],
                "reference": reference,
                "size": size,
                "trend_from_tokens": last["from_tokens"] if last else math.nan,
                "trend_to_tokens": last["to_tokens"] if last else math.nan,
                "n_seeds": last["n_seeds"] if last else 0,
                "change_per_doubling": last["change_per_doubling"] if last else math.nan,
                "change_lo": last["change_lo"] if last else math.nan,
                "change_hi": last["change_hi"] if last else math.nan,
                "extrapolated_tokens": at,
                "extrapolated_gap": fitted.estimate if fitted else math.nan,
                "extrapolated_lo": fitted.lo if fitted else math.nan,
                "extrapolated_hi": fitted.hi if fitted else math.nan,
                "bootstrap_draws": fitted.n_boot if fitted else 0,
                "extrapolation_at_bound": "; ".join(flags),
                "_doublings": mine_doublings,
            }
        )
    return rows
