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

The numbers are computed in `ablate.report.budget_gaps` (the gaps, their change per doubling and why
per doubling, the trend) and `ablate.report.budget_cost` (what the budgets cost); this module writes them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate.core import plot_style
from ablate.core.tables import markdown_table, si
from ablate.data import passes as data_passes
from ablate.report import stats
from ablate.report.budget_cost import cost_text, time_rows, train_seconds
from ablate.report.budget_gaps import (
    EXTRAPOLATE,
    budget_passes,
    by_budget,
    doubling_rows,
    gap_rows,
    generalization_rows,
    holm_over_budgets,
    rows_short_of_budgets,
    trend_rows,
)
from ablate.report.plots import passes_axis
from ablate.store import names

if TYPE_CHECKING:
    from ablate.store.study import SweepContext


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
    samplings: Sequence[str] = (),
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
    passes_axis(ax, split_tokens, max(budgets, default=0), samplings)
    plot_style.finish(
        ax,
        title=f"Paired gap to the reference row at each token budget ({n} seeds)",
        xlabel="training tokens (log scale)",
        ylabel="validation loss - reference's (nats/token)",
    )
    caption = "Markers: the budgets' mean paired differences; bands: 95% Student-t intervals over seeds."
    return plot_style.save(fig, path, caption=caption)


def write_budget_report(ctx: SweepContext, study: Any, records: list[Any], folder: Path) -> list[Path]:
    """Write the budget files (module doc) into `folder`; returns them."""
    from ablate.report.run_records import TRAIN_LOSS_POINTS, common_split
    from ablate.report.table import row_labels, write_csv

    order = list(ctx.recipe.variants)
    labels = row_labels(ctx)
    groups = by_budget(records)
    tables = _tables_at_budgets(ctx, groups)
    gaps = gap_rows(order, records, labels)
    family_note = holm_over_budgets(gaps)
    doublings = doubling_rows(order, records, labels)
    trends = trend_rows(order, records, labels, doublings)
    lines = _trend_lines(trends, gaps, labels, max(groups) if groups else 0)
    general = generalization_rows(order, records, labels)
    split = common_split(records)
    repeated = sorted({r.tokens for r in records if data_passes.repeats(r.passes)})
    checked = _predictions_section(folder, gaps)
    seconds = train_seconds(ctx, records)
    (cost,) = time_rows(study, records, seconds)
    short = rows_short_of_budgets(order, records, labels, list(groups))
    text = (
        _opening(ctx, records, list(groups), split, short)
        + "## The trend per row\n\n"
        + "\n".join(lines)
        + "\n\n"
        + _how_the_trend_is_computed(len({r.seed for r in records}))
        + cost_text(cost)
        + (checked[0] if checked else "")
        + f"## The gap at each budget\n\n{_gap_table(gaps)}\n\n{family_note} Δ Train: the same paired "
        f"difference of the training loss at the runs' ends (the mean of each run's last {TRAIN_LOSS_POINTS} "
        "logged values), at the same points.\n\n![gap vs tokens](gap_vs_tokens.png)\n\n"
        "## Generalization at each budget\n\n"
        + _repetition_text(split, repeated)
        + f"{_generalization_table(general)}\n\n"
        "## The table at each budget\n\n" + tables + "\n"
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
    trend_csv = [{k: v for k, v in t.items() if not k.startswith("_")} for t in trends]
    written.append(write_csv(folder / "trend.csv", trend_csv))
    if gaps:
        reference = labels[order[0]] if order else ""
        written.append(
            plot_gaps(
                gaps, order, folder / "gap_vs_tokens.png", reference, split, [r.sampling for r in records]
            )
        )
    return written


def _tables_at_budgets(ctx: SweepContext, groups: dict[int, list[Any]]) -> str:
    """The main table once per budget, each under a heading with its steps and passes."""
    from ablate.report.table import table_rows

    sections = []
    for tokens, group in groups.items():
        headers, rows, _ = table_rows(ctx, group)
        steps = {r.tags.get(names.BUDGET_STEPS) for r in group} - {None}
        sections.append(
            f"### {si(tokens)} tokens ({', '.join(sorted(steps)) or '?'} steps; "
            f"{_passes_text(budget_passes(group, tokens))})\n\n{markdown_table(headers, rows)}"
        )
    return "\n\n".join(sections)


def _trend_lines(
    trends: list[dict[str, Any]], gaps: list[dict[str, Any]], labels: dict[str, str], largest: int
) -> list[str]:
    """One bullet per trend row (`trend_sentence`); gives each row its reference's label (a column of
    `trend.csv`) and the sign of its gap at the largest budget."""
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
    return lines


def _opening(
    ctx: SweepContext, records: list[Any], budgets: list[int], split: float, short: list[str]
) -> str:
    """The title and the first paragraph: seeds, budgets, passes, and how each budget's runs trained."""
    seeds = sorted({r.seed for r in records})
    return (
        f"# {ctx.recipe.name} at scale {ctx.scale}: "
        + (f"every row at {len(budgets)} token budgets" if not short else f"{len(budgets)} token budgets")
        + f"\n\nSeeds {seeds}; budgets {', '.join(si(t) for t in budgets)} tokens"
        + (
            f" (passes over the {si(split)}-token training split: "
            f"{', '.join(_passes_text(budget_passes(records, t), short=True) for t in budgets)}; "
            f"{_read_twice_text(records, budgets)})"
            if math.isfinite(split)
            else ""
        )
        + (f"; not every row at each: {'; '.join(short)}" if short else "")
        + ". Each row and seed's longest run trained from step 0, or continued from the stable phase its "
        "previous longest run kept (an extension, ablate.sweep.extend); each smaller budget is its own run, "
        "branched off a longer run at its cooldown start (warmup-stable-decay, ablate.train.branches). "
        "Δ: row minus the reference row, paired by seed.\n\n"
    )


def _how_the_trend_is_computed(n_seeds: int) -> str:
    return (
        "Change per doubling: per seed, the change of the gap from one budget to the next over log2 of their "
        "ratio, for each pair of consecutive budgets; mean over seeds [95% Student-t] (every doubling in "
        "`doublings.csv`; the line quotes the last). Extrapolation: each row's final losses at "
        f"every budget fitted with L(D) = E + B D^-β (Huber on log loss), the gap of the fits at {EXTRAPOLATE}x "
        f"the largest budget, 95% percentile interval over paired resamples of seeds (with {n_seeds} seeds "
        f"there are {math.comb(2 * n_seeds - 1, n_seeds)} distinct resamples); it is a curve's "
        "prediction beyond the data, not a measurement.\n\n"
    )


def _gap_table(gaps: list[dict[str, Any]]) -> str:
    differences = ["Δ Valid vs reference (paired) [95% CI]", "Δ Train (paired) [95% CI]"]
    return markdown_table(
        ["Row", "tokens", "passes", *differences, "seeds"],
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


def _generalization_table(general: list[dict[str, Any]]) -> str:
    return markdown_table(
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
    from ablate.report.run_records import TRAIN_LOSS_POINTS

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
        "steps": r.tags.get(names.BUDGET_STEPS, ""),
        "state": r.state,
        **{k: r.values.get(k, math.nan) for k in ("valid", "ar_hit", "others")},
        "train_loss_end": r.values.get("train", math.nan),
        "mlflow_run_id": r.run_id or "",
        "branched_from": r.branched_from,
        "branch_step": r.tags.get(names.BRANCH_STEP, ""),
        "train_seconds": seconds.get(r.run_id, math.nan),
    }
