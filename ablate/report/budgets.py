"""The report of a study with token budgets (ablate.recipe.budgets): where each row's gap goes as tokens grow.

Written beside the main table (which is the largest budget's):

- `budgets.md`: the table at every budget; per row, the paired gap to the reference row at each budget;
  one line per row on the trend; how it was computed.
- `budgets.csv`: one row per run at every budget (the branches and the longest runs).
- `gap_vs_tokens.csv`: per row and budget, the paired difference to the reference row [95% Student-t],
  in validation loss and in the training loss at the runs' ends, with the budget's passes.
- `generalization.csv`: per row and budget, the passes over the training split, the training loss at
  the runs' ends, the validation loss and their difference (the generalization gap), over seeds.
- `doublings.csv`: per row and each doubling of the budget (each pair of consecutive budgets), the
  paired change of the gap per doubling [95% Student-t].
- `trend.csv`: per row, the change of the gap over the last doubling, and the fitted curves' gap at 10x
  the largest budget (an extrapolation, with a paired seed bootstrap).
- `time.csv`: what the budgets cost: training seconds and trained tokens of the runs from step 0, the
  branches and the extension runs, against the tokens a study trained from step 0 would train.
- `predicted_vs_measured.csv`, where the folder holds a `predictions.csv` written before the runs
  (`ablate.report.predict`): each predicted gap beside the measured one, and whether it held.
- `gap_vs_tokens.png`: each row's gap against tokens (log axis), markers at the budgets, 95% band.

The change per doubling is the paired change over each doubling: for each seed, (gap at the larger
budget - gap at the smaller) / log2(larger / smaller), the mean over seeds with a Student-t interval, one
per pair of consecutive budgets. Every budget enters it (each inner budget in two doublings), and a gap
that closes ever more slowly shows as a column of shrinking changes. One least-squares slope over
log-evenly spaced budgets would not: over three budgets it is (last - first) / 2, whatever the middle
budget measured, and over more it averages a decelerating change into a rate the last doubling no longer
has. The row's line quotes the last doubling (where the gap is going now) and `doublings.csv` has all.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate.core import plot_style
from ablate.core.tables import markdown_table, si
from ablate.data import passes as data_passes
from ablate.report import stats

if TYPE_CHECKING:
    from ablate.store.study import SweepContext

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


def trend_sentence(row: dict[str, Any], gap_at_largest: dict[str, Any] | None) -> str:
    """One line: the gap at the largest budget, whether it is still moving, and the extrapolation."""
    n = row["n_seeds"]
    span = f"{si(row['trend_from_tokens'])} to {si(row['trend_to_tokens'])} tokens"
    change = stats.Interval(row["change_per_doubling"], row["change_lo"], row["change_hi"], n)
    if n < 2 or not math.isfinite(change.lo):
        moving = f"change per doubling {stats.format_number(change.mean, sign=True)} ({n} seed: no interval)"
    else:
        direction = "shrinking" if (change.hi < 0) == (row["_gap_sign"] > 0) else "growing"
        verdict = (
            f"still {direction}"
            if change.lo > 0 or change.hi < 0
            else "no change resolved (interval holds 0)"
        )
        moving = (
            f"changes by {stats.format_number(change.mean, sign=True)} [{stats.format_number(change.lo, sign=True)}, "
            f"{stats.format_number(change.hi, sign=True)}] nats per doubling over the last doubling, {span}: "
            f"{verdict}"
        )
    earlier = [
        f"{stats.format_number(d['change_per_doubling'], sign=True)} ({si(d['from_tokens'])} to "
        f"{si(d['to_tokens'])})"
        for d in row.get("_doublings", [])[:-1]
    ]
    if earlier:
        moving += f"; earlier doublings: {', '.join(earlier)}"
    text = f"**{row['label']}** vs {row['reference_label']}: "
    if gap_at_largest:
        text += (
            f"gap {stats.format_number(gap_at_largest['gap'], sign=True)} "
            f"[{stats.format_number(gap_at_largest['lo'], sign=True)}, "
            f"{stats.format_number(gap_at_largest['hi'], sign=True)}] at {si(gap_at_largest['tokens'])} tokens; "
        )
    text += moving
    if row.get("extrapolation_at_bound"):
        text += (
            f". Extrapolation to {si(row['extrapolated_tokens'])} tokens not quoted: a fitted curve has a "
            f"parameter at its bound ({row['extrapolation_at_bound']}), so its value there rests on that "
            "constraint, not on the data (the numbers are in `trend.csv`)"
        )
    elif math.isfinite(row["extrapolated_gap"]):
        interval = (
            f" [{stats.format_number(row['extrapolated_lo'], sign=True)}, "
            f"{stats.format_number(row['extrapolated_hi'], sign=True)}]"
            if math.isfinite(row["extrapolated_lo"])
            else " (no interval: one seed)"
        )
        text += (
            f". Extrapolation (fitted L(D) = E + B D^-β per row, {n} seeds, paired seed bootstrap): "
            f"{stats.format_number(row['extrapolated_gap'], sign=True)}{interval} at "
            f"{si(row['extrapolated_tokens'])} tokens"
        )
    return text + "."


def plot_gaps(
    gaps: list[dict[str, Any]],
    order: list[str],
    path: Path,
    reference_label: str,
    split_tokens: float = math.nan,
) -> Path:
    from matplotlib.ticker import NullLocator

    colors = plot_style.variant_colors(order)
    fig, ax = plot_style.figure()
    ax.axhline(0.0, color="0.4", lw=0.8, label=f"{reference_label} (reference)")
    for variant in order:
        rows = [g for g in gaps if g["variant"] == variant]
        if not rows:
            continue
        xs = [g["tokens"] for g in rows]
        plot_style.series(ax, xs, [g["gap"] for g in rows], label=rows[0]["label"], color=colors[variant])
        lo, hi = [g["lo"] for g in rows], [g["hi"] for g in rows]
        if all(math.isfinite(v) for v in lo + hi):
            ax.fill_between(xs, lo, hi, color=colors[variant], alpha=0.15, linewidth=0)
    ax.set_xscale("log")
    budgets = sorted({g["tokens"] for g in gaps})
    ax.set_xticks(budgets, [si(b) for b in budgets])  # the budgets themselves, not the decades' 10^k
    ax.xaxis.set_minor_locator(NullLocator())
    n = max((g["n_seeds"] for g in gaps), default=0)
    plot_style.passes_axis(ax, split_tokens, max(budgets, default=0))
    plot_style.finish(
        ax,
        title=f"Paired gap to the reference row at each token budget ({n} seeds)",
        xlabel="training tokens (log scale)",
        ylabel="validation loss - reference's (nats/token)",
    )
    caption = "Markers: the budgets' mean paired differences; bands: 95% Student-t intervals over seeds."
    return plot_style.save(fig, path, caption=caption)


def trained_from(r: Any) -> tuple[str, int]:
    """How a budget's run trained, from its tags: ("step 0", 0), ("branch", its cooldown start: a smaller
    budget branched off the longest run) or ("extension", the step it continued from: a larger budget added
    to a finished study, continued from the kept stable phase; ablate.train.branches)."""
    if r.tags.get("ablate.branch_step"):
        return "branch", int(r.tags["ablate.branch_step"])
    if r.tags.get("ablate.continued_step"):
        return "extension", int(r.tags["ablate.continued_step"])
    return "step 0", 0


def time_rows(study: Any, records: list[Any], seconds: dict[str, float]) -> list[dict[str, Any]]:
    """What the budgets cost, in training seconds and in trained tokens: the runs from step 0, the
    branches' cooldowns and the extension runs (`trained_from`), against what a study trained from step 0
    at the same budgets trains (every largest-budget run from step 0, every other budget its cooldown).
    The trials' time summed (Optuna: start to end of each completed trial, training and bookkeeping) is
    given beside it."""
    from ablate.store.study import completed_spans

    trials = sum(
        (end - start).total_seconds() for start, end in completed_spans(study.get_trials(deepcopy=False))
    )
    train = {"step 0": 0.0, "branch": 0.0, "extension": 0.0}
    trained_tokens = 0
    extension_tokens = 0
    # (row, seed) -> its runs' (steps, tokens per step, cooldown steps)
    families: dict[tuple[str, int], list[tuple[int, int, int]]] = defaultdict(list)
    for r in records:
        if r.state != "finished":
            continue
        kind, start = trained_from(r)
        steps = int(r.tags.get("ablate.budget_steps", 0))
        per_step = r.tokens // steps if steps else 0
        train[kind] += seconds.get(r.run_id, math.nan)
        trained_tokens += (steps - start) * per_step
        extension_tokens += (steps - start) * per_step if kind == "extension" else 0
        families[(r.variant, r.seed)].append((steps, per_step, cooldown_steps(r, steps)))
    fresh = 0
    for runs in families.values():
        largest = max(runs)
        fresh += largest[0] * largest[1]
        fresh += sum(cooldown * per_step for steps, per_step, cooldown in runs if steps != largest[0])
    total = sum(train.values())
    return [
        {
            "trials_seconds_summed": round(trials, 1),
            "train_seconds_summed": round(total, 1),
            "longest_runs_train_seconds": round(train["step 0"], 1),
            "branch_runs_train_seconds": round(train["branch"], 1),
            "extension_runs_train_seconds": round(train["extension"], 1),
            "train_over_step0_runs": round(total / train["step 0"], 3) if train["step 0"] else math.nan,
            "trained_tokens": trained_tokens,
            "extension_trained_tokens": extension_tokens,
            "fresh_study_tokens": fresh,
        }
    ]


def cooldown_steps(record: Any, steps: int) -> int:
    """The cooldown of a budget of `steps` steps under the fraction the run recorded: what a study trained
    from step 0 trains for a budget below its largest."""
    from ablate.train.config import TrainConfig, cooldown_steps_of

    fraction = float(record.params.get("train.cooldown_fraction", TrainConfig.cooldown_fraction))
    return cooldown_steps_of(steps, fraction)


def write_budget_report(ctx: SweepContext, study: Any, records: list[Any], folder: Path) -> list[Path]:
    """Write the budget files (module doc) into `folder`; returns them."""
    from ablate.report.table import TRAIN_LOSS_POINTS, common_split, row_labels, table_rows, write_csv

    order = list(ctx.recipe.variants)
    labels = row_labels(ctx)
    groups = by_budget(records)
    sections = []
    for tokens, group in groups.items():
        headers, rows, _ = table_rows(ctx, group)
        steps = {r.tags.get("ablate.budget_steps") for r in group} - {None}
        sections.append(
            f"### {si(tokens)} tokens ({', '.join(sorted(steps)) or '?'} steps; "
            f"{_passes_text(budget_passes(group, tokens))})\n\n{markdown_table(headers, rows)}"
        )
    gaps = gap_rows(order, records, labels)
    family_note = holm_over_budgets(gaps)
    doublings = doubling_rows(order, records, labels)
    trends = trend_rows(order, records, labels, doublings)
    largest = max(groups) if groups else 0
    lines = []
    for row in trends:
        at_largest = next(
            (
                g
                for g in gaps
                if g["variant"] == row["variant"] and g["size"] == row["size"] and g["tokens"] == largest
            ),
            None,
        )
        row["reference_label"] = labels[row["reference"]]
        row["_gap_sign"] = at_largest["gap"] if at_largest else 0.0
        lines.append("- " + trend_sentence(row, at_largest))
    gap_table = markdown_table(
        [
            "Row",
            "tokens",
            "passes",
            "Δ Valid vs reference (paired) [95% CI]",
            "Δ Train (paired) [95% CI]",
            "seeds",
        ],
        [
            [
                g["label"],
                si(g["tokens"]),
                _passes_text(g["passes"], short=True),
                stats.format_ci(stats.Interval(g["gap"], g["lo"], g["hi"], g["n_seeds"])),
                stats.format_ci(stats.Interval(g["train_gap"], g["train_lo"], g["train_hi"], g["n_seeds"])),
                str(g["n_seeds"]),
            ]
            for g in gaps
        ],
    )
    general = generalization_rows(order, records, labels)
    general_table = markdown_table(
        ["Row", "tokens", "passes", "Train (end)", "Valid", "Valid − Train [95% CI]", "seeds"],
        [
            [
                g["label"] + (f" ({g['size']})" if g["size"] else ""),
                si(g["tokens"]),
                _passes_text(g["passes"], short=True),
                stats.format_number(g["train"]),
                stats.format_number(g["valid"]),
                stats.format_ci(
                    stats.Interval(
                        g["valid_minus_train"],
                        g["valid_minus_train_lo"],
                        g["valid_minus_train_hi"],
                        g["n_seeds"],
                    )
                ),
                str(g["n_seeds"]),
            ]
            for g in general
        ],
    )
    split = common_split(records)
    repeated = sorted({r.tokens for r in records if data_passes.repeats(r.passes)})
    checked = _predictions_section(folder, gaps)
    seeds = sorted({r.seed for r in records})
    seconds = train_seconds(ctx, records)
    (cost,) = time_rows(study, records, seconds)
    short = rows_short_of_budgets(order, records, labels, list(groups))
    text = (
        f"# {ctx.recipe.name} at scale {ctx.scale}: "
        + (f"every row at {len(groups)} token budgets" if not short else f"{len(groups)} token budgets")
        + f"\n\nSeeds {seeds}; budgets {', '.join(si(t) for t in groups)} tokens"
        + (
            f" (passes over the {si(split)}-token training split: "
            f"{', '.join(_passes_text(budget_passes(records, t), short=True) for t in groups)}; "
            f"{_read_twice_text(records, list(groups))})"
            if math.isfinite(split)
            else ""
        )
        + (f"; not every row at each: {'; '.join(short)}" if short else "")
        + ". Each row and seed's longest run trained from step 0, or continued from the stable phase its "
        "previous longest run kept (an extension, ablate.sweep.extend); each smaller budget is its own run, "
        "branched off a longer run at its cooldown start (warmup-stable-decay, ablate.train.branches). "
        "Δ: row minus the reference row, paired by seed.\n\n"
        "## The trend per row\n\n" + "\n".join(lines) + "\n\n"
        "Change per doubling: per seed, the change of the gap from one budget to the next over log2 of their "
        "ratio, for each pair of consecutive budgets; mean over seeds [95% Student-t] (every doubling in "
        "`doublings.csv`; the line quotes the last). Extrapolation: each row's final losses at "
        f"every budget fitted with L(D) = E + B D^-β (Huber on log loss), the gap of the fits at {EXTRAPOLATE}x "
        f"the largest budget, 95% percentile interval over paired resamples of seeds (with {len(seeds)} seeds "
        f"there are {math.comb(2 * len(seeds) - 1, len(seeds))} distinct resamples); it is a curve's "
        "prediction beyond the data, not a measurement.\n\n"
        + _cost_text(cost)
        + (checked[0] if checked else "")
        + f"## The gap at each budget\n\n{gap_table}\n\n{family_note} Δ Train: the same paired difference "
        f"of the training loss at the runs' ends (the mean of each run's last {TRAIN_LOSS_POINTS} logged "
        "values), at the same points.\n\n![gap vs tokens](gap_vs_tokens.png)\n\n"
        "## Generalization at each budget\n\n" + _repetition_text(split, repeated) + f"{general_table}\n\n"
        "## The table at each budget\n\n" + "\n\n".join(sections) + "\n"
    )
    written = [folder / "budgets.md"]
    written[0].write_text(text)
    written.append(write_csv(folder / "time.csv", [cost]))
    written.append(write_csv(folder / "budgets.csv", [_run_row(r, labels, seconds) for r in records]))
    written.append(write_csv(folder / "gap_vs_tokens.csv", gaps))
    written.append(write_csv(folder / "doublings.csv", doublings))
    written.append(write_csv(folder / "generalization.csv", general))
    if checked:
        written.append(write_csv(folder / "predicted_vs_measured.csv", checked[1]))
    written.append(
        write_csv(
            folder / "trend.csv", [{k: v for k, v in t.items() if not k.startswith("_")} for t in trends]
        )
    )
    if gaps:
        written.append(
            plot_gaps(gaps, order, folder / "gap_vs_tokens.png", labels[order[0]] if order else "", split)
        )
    return written


def _read_twice_text(records: list[Any], budgets: list[int]) -> str:
    """'share of the tokens read twice: 0%, 0%, 17% (each pass a permutation of disjoint windows)', per
    budget in order, one clause per way the runs drew their windows (ablate.data.passes)."""
    parts = []
    for sampling in data_passes.SAMPLINGS:
        shares = [
            data_passes.format_share(data_passes.read_twice(budget_passes(drew, t), sampling))
            for t in budgets
            if (drew := [r for r in records if r.sampling == sampling])
        ]
        if shares:
            words = data_passes.SAMPLING_WORDS[sampling].replace("read twice", "", 1).strip()
            parts.append(f"share of the tokens read twice: {', '.join(shares)} {words}")
    return "; ".join(parts)


def _passes_text(p: float, short: bool = False) -> str:
    if not math.isfinite(p):
        return "passes unknown" if not short else "?"
    mark = f" {data_passes.REPEATS}" if data_passes.repeats(p) else ""
    return f"{p:.2f}{mark}" if short else f"{p:.2f} passes over the training split{mark}"


def _repetition_text(split: float, repeated: list[int]) -> str:
    """What the generalization table is for, and which budgets read their training text again."""
    from ablate.report.table import TRAIN_LOSS_POINTS

    if not math.isfinite(split):
        return "The training split's size was not recorded: the passes are unknown.\n\n"
    text = (
        f"The training split holds {si(split)} tokens. Train (end): the mean of each run's last "
        f"{TRAIN_LOSS_POINTS} logged training losses; Valid − Train: the generalization gap, mean over seeds. "
    )
    if repeated:
        text += (
            f"{data_passes.REPEATS} Budget{'s' * (len(repeated) > 1)} {', '.join(si(t) for t in repeated)} "
            f"{'are' if len(repeated) > 1 else 'is'} past one pass. {data_passes.REPEAT_EFFECT} Compare the "
            "rows' Δ Train with their Δ Valid above, and the Valid − Train gaps here."
        )
    else:
        text += "Every budget is under one pass: no run read its training text twice."
    return text + "\n\n"


def _cost_text(cost: dict[str, Any]) -> str:
    """The cost paragraph of `budgets.md` (every number from `time.csv`)."""
    minutes = {k: cost[k] / 60 for k in cost if k.endswith("seconds") or k.endswith("seconds_summed")}
    extension = (
        f", the extension runs (continued from their kept stable phase) "
        f"{minutes['extension_runs_train_seconds']:.1f} min"
        if cost["extension_trained_tokens"]
        else ""
    )
    text = (
        f"Cost: training took {minutes['train_seconds_summed']:.1f} min summed over runs: the runs trained "
        f"from step 0 {minutes['longest_runs_train_seconds']:.1f} min, the branches' cooldowns "
        f"{minutes['branch_runs_train_seconds']:.1f} min{extension}; {cost['train_over_step0_runs']:.2f}x "
        f"the runs from step 0. Trained tokens: {si(cost['trained_tokens'])}, where a study trained from "
        f"step 0 at the same budgets trains {si(cost['fresh_study_tokens'])}"
    )
    if cost["extension_trained_tokens"]:
        share = cost["extension_trained_tokens"] / cost["fresh_study_tokens"]
        text += (
            f"; the extension trained {si(cost['extension_trained_tokens'])} of them "
            f"({share:.1%} of a fresh study's)"
        )
    return text + (
        f". The trials (training and bookkeeping) took {minutes['trials_seconds_summed']:.1f} min summed over "
        "workers (`time.csv`).\n\n"
    )


def _predictions_section(folder: Path, gaps: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]] | None:
    """The predictions written before the runs (`predictions.csv` in the folder) against the measured gaps:
    a markdown section and its rows, or None without predictions."""
    from ablate.report.predict import against_measured, read_predictions

    if not (folder / "predictions.csv").is_file():
        return None
    rows = against_measured(read_predictions(folder / "predictions.csv"), gaps)
    verdict = {"true": "held", "false": "did not hold", "": "not measured"}
    table = markdown_table(
        ["Row", "tokens", "predicted [95%]", "measured [95% CI]", "prediction"],
        [
            [
                r["label"],
                si(int(r["tokens"])),
                _signed(float(r["predicted_gap"]), float(r["predicted_lo"]), float(r["predicted_hi"])),
                _signed(r["measured_gap"], r["measured_lo"], r["measured_hi"])
                if r["measured_seeds"]
                else "-",
                verdict[r["held"]] + (f" (fit: {r['at_bound']})" if r["at_bound"] else ""),
            ]
            for r in rows
        ],
    )
    text = (
        "## Predicted before the runs, and measured\n\n"
        "`predictions.csv` was written before these budgets were trained, from the fits to the budgets "
        "measured then (`ablate.report.predict`). A prediction held if the measured mean gap lies inside its "
        f"interval.\n\n{table}\n\n"
    )
    return text, rows


def _signed(mean: float, lo: float, hi: float) -> str:
    """'−0.055 [−0.111, −0.026]': signed, the interval where there is one."""
    text = stats.format_number(mean, sign=True)
    if math.isfinite(lo):
        text += f" [{stats.format_number(lo, sign=True)}, {stats.format_number(hi, sign=True)}]"
    return text


def _run_row(r: Any, labels: dict[str, str], seconds: dict[str, float]) -> dict[str, Any]:
    return {
        "variant": r.variant,
        "label": labels.get(r.variant, r.variant),
        "size": r.size,
        "seed": r.seed,
        "tokens": r.tokens,
        "passes": round(r.passes, 4) if math.isfinite(r.passes) else math.nan,
        "steps": r.tags.get("ablate.budget_steps", ""),
        "state": r.state,
        **{k: r.values.get(k, math.nan) for k in ("valid", "ar_hit", "others")},
        "train_loss_end": r.values.get("train", math.nan),
        "mlflow_run_id": r.run_id or "",
        "branched_from": r.branched_from,
        "branch_step": r.tags.get("ablate.branch_step", ""),
        "train_seconds": seconds.get(r.run_id, math.nan),
    }


def train_seconds(ctx: SweepContext, records: list[Any]) -> dict[str, float]:
    """Run id -> its training seconds (final_metrics.json: the Trainer's fit, and where the run was resumed,
    its earlier attempts' up to the checkpoint it resumed from: ablate.train.training_clock; a run recorded
    before that was counted shows its last attempt's only)."""
    import json

    from ablate.store import tracking

    client = ctx.stores.client()
    out = {}
    for r in records:
        if r.run_id and r.state == "finished":
            try:
                text = tracking.artifact_text(client, r.run_id, "final_metrics.json")
                if text is None:
                    raise ValueError(f"run {r.run_id}: finished, but it has no final_metrics.json")
                final = json.loads(text)
                seconds = float(final["seconds"]) + float(final.get("earlier_attempts_seconds", 0.0))
            except (tracking.ArtifactUnreadable, ValueError, KeyError, TypeError) as e:
                why = str(e) if str(e).startswith("run ") else f"run {r.run_id}: {tracking.first_line(e)}"
                print(f"[report] time.csv: {why}; its training seconds are left out (nan)", flush=True)
                seconds = math.nan
            out[r.run_id] = seconds
    return out
