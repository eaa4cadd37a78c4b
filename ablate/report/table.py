"""The paper-style table of a finished sweep, with honest statistics (written by `ablate.report.write`).

Reads the sweep's runs as records (`ablate.report.run_records`); never imports a model. Its cells and
notes go into `<reports>/<recipe>[-<scale>]/`: `table.md`, `table.csv`, `summary.csv`, `paper.csv`,
`loss_curves.png`; the marks and notes on how far to trust them are `ablate.report.honesty`'s.

Every cell is the mean over seeds with a 95% Student-t interval; the difference to the first row is
paired by seed (same data order and shared initialisation), with its interval and a star when the
interval excludes zero. Failed runs are listed with their reason and left out of the statistics.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate.core.tables import si
from ablate.report import stats
from ablate.report.plots import passes_axis
from ablate.report.run_records import RunRecord, budgeted, common_split
from ablate.store import names

if TYPE_CHECKING:
    from ablate.store.study import SweepContext


def best_per_variant(records: list[RunRecord]) -> tuple[list[RunRecord], list[str]]:
    """Search protocol: keep, per variant, the searched point with the lowest mean validation loss."""
    groups: dict[tuple[str, str], dict[str, list[RunRecord]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        groups[(r.variant, r.size)][repr(sorted(r.searched.items()))].append(r)
    kept, chosen = [], []
    for (variant, size), points in groups.items():

        def score(rs: list[RunRecord]) -> float:
            values = [r.values.get("valid", math.nan) for r in rs]
            finite = [v for v in values if math.isfinite(v)]
            return sum(finite) / len(finite) if finite else math.inf

        best = min(points.values(), key=score)
        kept.extend(best)
        if best and best[0].searched:
            chosen.append(
                f"{variant}{'@' + size if size else ''}: "
                + ", ".join(f"{k[len('base.') :]}={v}" for k, v in best[0].searched.items())
            )
    return kept, chosen


def edge_warnings(records: list[RunRecord], search: Any) -> list[str]:
    warnings = []
    for dim in getattr(search, "dimensions", ()):
        for r in records:
            if dim.key in r.searched and dim.at_edge(r.searched[dim.key]):
                warnings.append(
                    f"{r.variant}: best {dim.key[len('base.') :]} = {r.searched[dim.key]} lies at the edge "
                    "of the searched range; the optimum may lie outside it"
                )
    return sorted(set(warnings))


def pair_key(r: RunRecord) -> Any:
    """What pairs two rows' runs: the seed; in a budgeted study also the budget, so a row whose runs
    stopped at a smaller budget than the reference's (an extension it missed) is not set against the
    reference's longer runs. Rows given different lengths on purpose (matched compute) still pair."""
    return (r.seed, r.tokens) if budgeted(r) else r.seed


def row_diffs(order: list[str], records: list[RunRecord]) -> dict[tuple[str, str], Any]:
    """(size, variant) -> paired difference of the final validation loss to the size's first row, paired
    by seed (`pair_key`)."""
    by_key: dict[tuple[str, str], list[RunRecord]] = defaultdict(list)
    for r in records:
        by_key[(r.size, r.variant)].append(r)
    diffs = {}
    for size in {r.size for r in records}:
        first = next((v for v in order if (size, v) in by_key), None)
        ref = {
            pair_key(r): r.values.get("valid", math.nan)
            for r in by_key.get((size, first), [])
            if r.state == "finished"
        }
        for variant in order:
            if variant != first and (size, variant) in by_key:
                mine = {
                    pair_key(r): r.values.get("valid", math.nan)
                    for r in by_key[(size, variant)]
                    if r.state == "finished"
                }
                diffs[(size, variant)] = stats.paired_difference(mine, ref)
    return diffs


def size_order(ctx: SweepContext, records: list[RunRecord]) -> list[str]:
    """The records' sizes in the order the recipe's scale lists them (smallest first, as recipes write
    them), then any the recipe does not name; "" (a recipe without sizes) first."""
    listed = list(ctx.recipe.sizes(ctx.scale) or {})
    present = {r.size for r in records}
    return [s for s in listed if s in present] + sorted(present - set(listed), key=lambda s: (s != "", s))


def table_rows(
    ctx: SweepContext,
    records: list[RunRecord],
    marks: dict[tuple[str, str], str] | None = None,
) -> tuple[list[str], list[list[str]], list[dict[str, Any]]]:
    """Markdown headers and rows, and CSV rows (numbers, not text); `marks` are appended to row labels
    ((size, variant) -> e.g. the not-converged mark)."""
    order = list(ctx.recipe.variants)
    by_key: dict[tuple[str, str], list[RunRecord]] = defaultdict(list)
    for r in records:
        by_key[(r.size, r.variant)].append(r)
    sizes = size_order(ctx, records)
    diffs = row_diffs(order, records)
    marks = marks or {}
    labels = row_labels(ctx)
    paper = ctx.scale == "paper" and any(v.paper for v in ctx.recipe.variants.values())
    headers = _headers(any(sizes), paper)
    rows, csv_rows = [], []
    for size in sizes:
        first = next((v for v in order if (size, v) in by_key), None)
        for variant in order:
            group = by_key.get((size, variant))
            if not group:
                continue
            label = labels[variant] + (f" {marks[(size, variant)]}" if marks.get((size, variant)) else "")
            row = [label] + ([size] if any(sizes) else []) + _cells(group, diffs.get((size, variant)), first)
            if paper:
                p = ctx.recipe.variants[variant].paper or {}
                row.append(
                    " / ".join(f"{p[k]:.3f}" if k in p else "-" for k in ("valid", "ar_hit", "others"))
                )
            rows.append(row)
            csv_rows += [_csv_row(r, labels[variant], size) for r in group]
    if not any(math.isfinite(r.values.get("ar_hit", math.nan)) for r in records if r.state == "finished"):
        # A task recipe (or any run without the bigram split): no AR-Hit slices, so no columns of n/a.
        keep = [i for i, h in enumerate(headers) if h not in AR_HIT_COLUMNS]
        headers = [headers[i] for i in keep]
        rows = [[row[i] for i in keep] for row in rows]
    return headers, rows, csv_rows


def _headers(sized: bool, paper: bool) -> list[str]:
    return (
        ["Model"]
        + (["size"] if sized else [])
        + [
            "#heads",
            "d",
            "GN",
            "Valid",
            "AR-Hit",
            "Others",
            "AR-Hit share",
            "Δ Valid vs row 1 (paired)",
            "seeds",
        ]
        + (["paper Valid / AR-Hit / Others"] if paper else [])
    )


def _cells(group: list[RunRecord], diff: Any, first: str | None) -> list[str]:
    """One row's cells from `#heads` to `seeds`: its runs' shape tags, each metric's mean [95% CI] over
    the finished runs, the paired difference to the reference (`diff`; None for the reference itself,
    the size's `first` row), and how many seeds finished, with each failed one's reason."""
    tags = next((r.tags for r in group if r.tags), {})
    finished = [r for r in group if r.state == "finished"]
    cells = {
        name: stats.mean_ci([r.values.get(name, math.nan) for r in finished])
        for name in ("valid", "ar_hit", "others", "ar_hit_share")
    }
    if group[0].variant == first:
        diff_text = "(reference)"
    else:
        diff_text = stats.format_diff(diff) + (f" ({stats.format_p(diff.p_value)})" if diff.n >= 2 else "")
    failed = [r for r in group if r.state in ("failed", "pruned")]
    seeds_text = f"{len(finished)}/{len(group)}" + "".join(
        f"; seed {r.seed} {r.state.upper()}: {r.reason or '-'}" for r in failed
    )
    return [
        tags.get(names.HEADS, "?"),
        tags.get(names.HEAD_WIDTH, "?"),
        tags.get(names.GROUP_NORM, "?"),
        stats.format_ci(cells["valid"]),
        stats.format_ci(cells["ar_hit"]),
        stats.format_ci(cells["others"]),
        f"{cells['ar_hit_share'].mean:.1%}" if math.isfinite(cells["ar_hit_share"].mean) else "n/a",
        diff_text,
        seeds_text,
    ]


def _csv_row(r: RunRecord, label: str, size: str) -> dict[str, Any]:
    """One run's line of `table.csv`."""
    return {
        "variant": r.variant,
        "label": label,
        "size": size,
        "seed": r.seed,
        "state": r.state,
        "reason": r.reason,
        **{k: r.values.get(k, math.nan) for k in ("valid", "ar_hit", "others", "ar_hit_share")},
        "train_loss_end": r.values.get("train", math.nan),
        "mlflow_run_id": r.run_id or "",
        **r.searched,
    }


AR_HIT_COLUMNS = ("AR-Hit", "Others", "AR-Hit share")


def summary_rows(
    ctx: SweepContext, records: list[RunRecord], family: tuple[dict, int] | None = None
) -> list[dict[str, Any]]:
    """The table's cells as numbers (summary.csv): per row, each metric's mean and 95% Student-t interval
    over seeds, the paired difference to the first row with its p-value and its spread over seeds
    (`spread_columns`), and whether it survives Holm's
    correction over the table's comparisons, or over `family`'s (ablate.report.holm_family)."""
    order = list(ctx.recipe.variants)
    diffs = row_diffs(order, records)
    tested = [k for k, d in diffs.items() if d.n >= 2]
    survives = dict(zip(tested, stats.holm([diffs[k].p_value for k in tested])))
    if family is not None:
        survives = _in_family(family, tested, records)
    labels = row_labels(ctx)
    rows = []
    for size in size_order(ctx, records):
        for variant in order:
            group = [r for r in records if r.size == size and r.variant == variant and r.state == "finished"]
            if not group:
                continue
            row: dict[str, Any] = {
                "variant": variant,
                "label": labels[variant],
                "size": size,
                "seeds": len(group),
                "tokens": max(r.tokens for r in group),  # training tokens per run (the `ablate.tokens` tag)
            }
            for name in ("valid", "ar_hit", "others", "ar_hit_share"):
                iv = stats.mean_ci([r.values.get(name, math.nan) for r in group])
                row.update({f"{name}_mean": iv.mean, f"{name}_lo": iv.lo, f"{name}_hi": iv.hi})
            d = diffs.get((size, variant))
            row.update(
                {
                    **stats.diff_columns(d),
                    **spread_columns(d),
                    "holm_survives": ""
                    if (size, variant) not in survives
                    else str(survives[(size, variant)]).lower(),
                }
            )
            rows.append(row)
    return rows


def spread_columns(d: Any) -> dict[str, float]:
    """How much one seed moves a row's paired difference (summary.csv): the per-seed differences' sample
    standard deviation, smallest and largest (NaN for the first row)."""
    return {
        "diff_seed_sd": d.sd if d else math.nan,
        "diff_seed_min": d.smallest if d else math.nan,
        "diff_seed_max": d.largest if d else math.nan,
    }


def paper_rows(ctx: SweepContext) -> list[dict[str, Any]]:
    """The paper's numbers the recipe quotes per row (`variants.<v>.paper`), with each metric's difference
    to the first row (paper.csv), and the paper's setting when the recipe names it (`paper_reference`)."""
    order = [v for v, spec in ctx.recipe.variants.items() if spec.paper]
    if not order:
        return []
    first = ctx.recipe.variants[order[0]].paper
    rows = []
    for variant in order:
        paper = ctx.recipe.variants[variant].paper
        row: dict[str, Any] = {"variant": variant, "label": row_labels(ctx)[variant]}
        for metric, value in paper.items():
            row[f"paper_{metric}"] = value
            row[f"paper_{metric}_vs_first"] = round(value - first[metric], 6) if metric in first else math.nan
        rows.append(row)
    return rows


def write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Rows of dicts as CSV, the columns in order of first appearance."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(
            f, fieldnames=list(dict.fromkeys(k for row in rows for k in row)) or ["variant"]
        )
        writer.writeheader()
        writer.writerows(rows)
    return path


def plot_loss_curves(
    records: list[RunRecord], labels: dict[str, str], path: Path, order: list[str] | None = None
) -> Path:
    """One line per run through its validations (markers), one colour per variant (its place in the
    recipe's order, as in every plot of the recipe), one legend entry per variant."""
    from ablate.core import plot_style

    order = order or list(dict.fromkeys(r.variant for r in records))
    colors = plot_style.variant_colors(order)
    fig, ax = plot_style.figure(7, 4.5)
    named: set[str] = set()
    for r in sorted(
        records, key=lambda r: (order.index(r.variant) if r.variant in order else len(order), r.size, r.seed)
    ):
        if not r.curve:
            continue
        key = r.variant + (f" ({r.size})" if r.size else "")
        xs, ys = zip(*r.curve)
        plot_style.series(
            ax,
            xs,
            ys,
            label=None
            if key in named
            else labels.get(r.variant, r.variant) + (f" ({r.size})" if r.size else ""),
            color=colors.get(r.variant, "0.5"),
            alpha=0.8,
            linewidth=1.1,
        )
        named.add(key)
    seeds = len({r.seed for r in records if r.curve})
    largest = max((t for r in records for t, _ in r.curve), default=0)
    passes_axis(ax, common_split(records), largest, [r.sampling for r in records])
    plot_style.finish(
        ax,
        title=f"Validation loss during training ({seeds} seed{'s' * (seeds != 1)})",
        xlabel="training tokens",
        ylabel="validation loss (nats/token)",
    )
    caption = (
        "One line per run (seed), markers at its validations; one colour per variant, one legend entry each."
    )
    return plot_style.save(fig, path, caption=caption)


def row_labels(ctx: SweepContext) -> dict[str, str]:
    """Variant -> its label, unique (ablate.recipe.schema.row_labels)."""
    from ablate.recipe.schema import row_labels as unique_labels

    return unique_labels(ctx.recipe.variants)


def add_convergence_columns(csv_rows: list[dict[str, Any]], convergence: dict[str, Any]) -> None:
    for row in csv_rows:
        c = convergence.get(row.get("mlflow_run_id"))
        row["converged"] = "" if c is None else {True: "yes", False: "no", None: "unknown"}[c.converged]
        row["predicted_gain_2x_tokens"] = math.nan if c is None else c.predicted_gain


def precisions(records: list[RunRecord]) -> str:
    """The precisions the runs trained in, with the rule's reason (the machine's capability)."""
    seen = {
        f"{r.tags[names.PRECISION]} ({r.tags.get(names.PRECISION_REASON, 'reason not recorded')})"
        for r in records
        if r.tags.get(names.PRECISION)
    }
    return "; ".join(sorted(seen)) or "not recorded"


def comparisons_note(
    ctx: SweepContext, records: list[RunRecord], family: tuple[dict, int] | None = None
) -> str:
    """How many paired comparisons the table makes, and which of its stars survive Holm's correction (over
    the table's comparisons, or over `family`'s: ablate.report.holm_family); then the rows not compared
    because their runs have other token counts than the reference's."""
    text = _compared_note(ctx, records, family)
    apart = _other_budget_rows(ctx, records)
    return " ".join(t for t in (text, apart) if t)


def _other_budget_rows(ctx: SweepContext, records: list[RunRecord]) -> str:
    order = list(ctx.recipe.variants)
    labels = row_labels(ctx)
    apart = []
    for size in size_order(ctx, records):
        tokens = {
            v: sorted(
                {
                    r.tokens
                    for r in records
                    if r.size == size and r.variant == v and r.state == "finished" and budgeted(r)
                }
            )
            for v in order
        }
        present = [v for v in order if tokens[v]]
        for variant in present[1:]:
            if tokens[variant] != tokens[present[0]]:
                size_text = f" ({size})" if size else ""
                apart.append(
                    f"{labels[variant]}{size_text} ran {', '.join(si(t) for t in tokens[variant])} tokens, the "
                    f"reference {', '.join(si(t) for t in tokens[present[0]])}"
                )
    if not apart:
        return ""
    listed = "; ".join(apart)
    return f"Not compared here, their runs being of other lengths: {listed} (`budgets.md` pairs each budget)."


def _in_family(family: tuple[dict, int], keys: list, records: list[RunRecord]) -> dict:
    """Each table comparison (size, variant) -> whether it survives in the study's family, at its runs'
    budget."""
    tokens = {(r.size, r.variant): float(r.tokens) for r in records if r.state == "finished"}
    return {k: family[0].get((*k, tokens.get(k)), False) for k in keys}


def _compared_note(
    ctx: SweepContext, records: list[RunRecord], family: tuple[dict, int] | None = None
) -> str:
    diffs = {k: d for k, d in row_diffs(list(ctx.recipe.variants), records).items() if d.n >= 2}
    if not diffs:
        return ""
    keys = list(diffs)
    survive = stats.holm([diffs[k].p_value for k in keys])
    if family is not None:
        in_family = _in_family(family, keys, records)
        survive = [in_family[k] for k in keys]
    starred = [k for k in keys if diffs[k].significant]
    kept = [k for k in starred if survive[keys.index(k)]]

    def name(key: tuple[str, str]) -> str:
        size, variant = key
        return row_labels(ctx)[variant] + (f" ({size})" if size else "")

    text = f"{len(keys)} comparison{'s' * (len(keys) != 1)} (each row against the first row of its size)"
    if not starred:
        return text + "; no star to correct."
    return (
        text
        + f"; {len(kept)} of the {len(starred)} star{'s' * (len(starred) != 1)} "
        + f"survive{'s' * (len(kept) == 1)} Holm's correction "
        + (
            f"for the study's {family[1]} comparisons (every row at every budget, `gap_vs_tokens.csv`)"
            if family is not None
            else f"for {len(keys)} comparisons"
        )
        + " at 5%"
        + (f": {', '.join(name(k) for k in kept)}." if kept else ".")
    )
