"""What a report says about itself (ablate.report.checks put together for one table): the lines under its
title, the marks beside its rows, the notes under it, each run's convergence, and the sections on the
searched grid's sensitivity and on the residual stream."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ablate.data import passes as data_passes
from ablate.report.run_records import RunRecord
from ablate.report.table import row_diffs, row_labels, size_order

if TYPE_CHECKING:
    from ablate.store.study import SweepContext


@dataclass
class Honesty:
    """What the report says about itself (ablate.report.checks): lines under the title, row marks, notes
    under the table, per-run convergence, and the lr-sensitivity section (empty without a search)."""

    header: list[str]
    marks: dict[tuple[str, str], str]
    notes: list[str]
    convergence: dict[str, Any]
    sensitivity: str = ""
    layers: str = ""  # per-layer statistics per row (why a row lags)
    sensitivity_rows: list[dict[str, Any]] = field(default_factory=list)  # lr_sensitivity.csv
    layer_rows: list[dict[str, Any]] = field(default_factory=list)  # layer_stats.csv


def honesty_checks(ctx: SweepContext, all_records: list[RunRecord], records: list[RunRecord]) -> Honesty:
    """`records`: the runs the table shows; `all_records`: every run of the sweep (every searched point)."""
    from ablate.report import checks as rc

    convergence = rc.convergence_by_run(records)
    groups: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for r in records:
        if r.run_id in convergence:
            groups[(r.size, r.variant)].append(convergence[r.run_id])
    marks = {key: mark for key, cs in groups.items() if (mark := rc.row_mark(cs))}
    for r in records:  # a row that read its text again says so beside its convergence mark
        if r.state == "finished" and data_passes.repeats(r.passes):
            key = (r.size, r.variant)
            marks[key] = marks.get(key, "").replace(data_passes.REPEATS, "") + data_passes.REPEATS
    purpose = rc.scale_purpose(ctx.recipe.scale_overlay(ctx.scale).purpose, ctx.scale)
    searched = sorted({k[len("base.") :] for r in all_records for k in r.searched})
    if searched:  # the scale's purpose line describes its seeded table, not a search at that scale
        seeds = sorted({r.seed for r in all_records})
        purpose = (
            f"A search over {', '.join(searched)} at scale {ctx.scale}, seed{'s' * (len(seeds) != 1)} "
            f"{', '.join(map(str, seeds))}: it chooses the setting; each row is shown at its best point."
        )
    overridden = getattr(ctx.recipe, "base_overrides", [])
    if purpose and overridden:  # the scale's words describe its own settings, not what an override ran
        changed = ", ".join(f"`{key}={value}`" for key, value in overridden)
        purpose += f" (The scale's own words: these runs overrode {changed}; the lines below say what ran.)"
    data = rc.data_line(records)
    header = ([purpose] if purpose else []) + [
        rc.tokens_and_convergence(records, convergence),
        *([data] if data else []),
        rc.lr_protocol(records, searched=any(r.searched for r in all_records)),
    ]
    notes = []
    if any(rc.NOT_CONVERGED in m for m in marks.values()):
        notes.append(
            f"{rc.NOT_CONVERGED}: at least one run of the row had not converged (its fitted loss curve "
            "predicts 1% or more lower loss from twice the tokens)."
        )
    if any(rc.UNKNOWN in m for m in marks.values()):
        notes.append(
            f"{rc.UNKNOWN}: a run of the row had too few validations after warmup to fit a loss curve."
        )
    if any(data_passes.REPEATS in m for m in marks.values()):
        notes.append(
            f"{data_passes.REPEATS}: at least one run of the row made more than one pass over its training "
            "split (table.csv's `passes`)."
        )
    if rc.all_intervals_contain_zero(row_diffs(list(ctx.recipe.variants), records).values()):
        notes.append(rc.ALL_CONTAIN_ZERO)
    sensitivity = rc.lr_sensitivity(all_records, list(ctx.recipe.variants), size_order(ctx, all_records))
    labels = row_labels(ctx)
    text = rc.sensitivity_markdown(sensitivity, labels) if sensitivity else ""
    grid = rc.sensitivity_rows(sensitivity, labels) if sensitivity else []
    layers, layer_rows = rc.layer_report(records, list(ctx.recipe.variants), labels)
    return Honesty(header, marks, notes, convergence, text, layers, grid, layer_rows)
