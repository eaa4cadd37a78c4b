"""The report's paired differences on the sweep's MLflow parent run, against training tokens, for the UI.

The question a study answers is a paired difference: a row minus the reference row (the first row of the
recipe at its size), over seeds, with its 95% interval, and how it moves as tokens grow. MLflow's charts
neither subtract runs nor draw a band over seeds, so the differences are logged as metrics of the parent
run, which `ablate.store.comparison` charts. Every value comes from `ablate.report.stats.paired_difference`
on the runs `ablate.report.run_records.collect` reads, the functions the report's table and its budget
section use: the last point of a row's curve is the table's Δ, a budget's point is its `gap_vs_tokens.csv` row.

Series of the parent run (MLflow's step is an integer: the training tokens of the point):

- `diff/<metric>/<row>/mean`, `.../low`, `.../high`: at every evaluation point of the row's runs, the mean
  paired difference to the reference and the two ends of its 95% paired-t interval, for each validation
  metric the table reports (`val/loss`, `val/ar_hit`, `val/others`); `<row>` is the variant, with
  `:<size>` in a recipe with sizes. With one seed there is no interval: `mean` alone, and the parent run's
  description (MLflow's run note) says so, as the report's "n=1, no interval".
- `budget/val/loss/<row>/mean`, `low`, `high`: a budget study's difference at each budget (its final
  validation loss, paired by seed), one point per budget.

A row's points are written once both it and its reference have no trial waiting or running (each finished
trial calls `log_differences`): MLflow keeps every value logged at a step and a chart joins them all, so
a point is never rewritten. Seeds added to a study later (`ablate sweep --seeds`) reach the report, not
the points already written.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from ablate.report import stats
from ablate.report.run_records import METRICS, RunRecord, collect
from ablate.report.table import best_per_variant, pair_key, row_labels
from ablate.store.comparison import COLOR_TAG, PARENT_COLOR, row_colors
from ablate.store.difference_keys import (
    BUDGET,
    DIFF,
    ENDS,
    NOTE_TAG,
    ONE_SEED_TAG,
    ORDER_TAG,
    REFERENCE_TAG,
    row_name,
    series_key,
)
from ablate.store.tracking import set_tags

if TYPE_CHECKING:
    from ablate.store.study import SweepContext

BATCH = 1000


def curves(client: Any, record: RunRecord, metrics: list[str]) -> dict[str, dict[int, float]]:
    """metric -> {training tokens: value} at the run's evaluation points (the report's curve, every
    metric: a step's tokens from the run's `tokens` series)."""
    tokens = {m.step: m.value for m in client.get_metric_history(record.run_id, "tokens")}
    out: dict[str, dict[int, float]] = {}
    for metric in metrics:
        points: dict[int, float] = {}
        for m in sorted(
            client.get_metric_history(record.run_id, metric), key=lambda m: (m.step, m.timestamp)
        ):
            points[int(tokens.get(m.step, m.step))] = m.value  # the step's last value, as MLflow's latest
        out[metric] = points
    return out


def paired_points(
    mine: dict[Any, dict[int, float]], ref: dict[Any, dict[int, float]]
) -> dict[int, stats.PairedDiff]:
    """tokens -> paired difference over the pairing keys both sides have a value at those tokens."""
    every = sorted({t for c in mine.values() for t in c} & {t for c in ref.values() for t in c})
    return {
        t: stats.paired_difference(
            {k: c[t] for k, c in mine.items() if t in c}, {k: c[t] for k, c in ref.items() if t in c}
        )
        for t in every
    }


def difference_series(
    client: Any, order: list[str], records: list[RunRecord], settled: set[tuple[str, str]]
) -> tuple[dict[str, dict[int, float]], dict[str, str], list[str]]:
    """(series key -> {tokens: value}, size -> reference row, the rows whose differences have one seed)
    of the rows in `settled` ((size, variant) pairs whose runs and reference's runs have all ended)."""
    finished = [r for r in records if r.state == "finished" and r.run_id and not r.branched_from]
    metrics = [key for _, key in METRICS]
    read: dict[str, dict[str, dict[int, float]]] = {}
    series: dict[str, dict[int, float]] = {}
    references: dict[str, str] = {}
    one_seed: list[str] = []
    for size in sorted({r.size for r in finished}):
        present = [v for v in order if any(r.variant == v and r.size == size for r in finished)]
        if len(present) < 2:
            continue
        references[size] = present[0]

        def by_pair(variant: str, size: str, metric: str) -> dict[Any, dict[int, float]]:
            out = {}
            for r in finished:
                if r.variant == variant and r.size == size:
                    if r.run_id not in read:
                        read[r.run_id] = curves(client, r, metrics)
                    out[pair_key(r)] = read[r.run_id][metric]
            return out

        for variant in present[1:]:
            if (size, variant) not in settled:
                continue
            for metric in metrics:
                points = paired_points(by_pair(variant, size, metric), by_pair(present[0], size, metric))
                points = {t: d for t, d in points.items() if d.n > 0}
                if not points:
                    continue
                row = row_name(variant, size)
                if max(d.n for d in points.values()) < 2:
                    one_seed.append(row)
                for end, field in zip(ENDS, ("mean", "lo", "hi")):
                    values = {t: getattr(d, field) for t, d in points.items()}
                    values = {t: v for t, v in values.items() if math.isfinite(v)}
                    if values:
                        series[series_key(DIFF, metric, row, end)] = values
    return series, references, sorted(set(one_seed))


def budget_series(
    order: list[str], records: list[RunRecord], labels: dict[str, str], settled: set[tuple[str, str]]
) -> dict[str, dict[int, float]]:
    """A budget study's difference at each budget (the report's `gap_vs_tokens.csv` rows)."""
    from ablate.report.budget_gaps import gap_rows

    series: dict[str, dict[int, float]] = defaultdict(dict)
    for row in gap_rows(order, records, labels):
        if (row["size"], row["variant"]) not in settled:
            continue
        for end, field in zip(ENDS, ("gap", "lo", "hi")):
            if math.isfinite(row[field]):
                key = series_key(BUDGET, "val/loss", row_name(row["variant"], row["size"]), end)
                series[key][int(row["tokens"])] = row[field]
    return dict(series)


def settled_rows(study: Any, records: list[RunRecord], finished_run: str = "") -> set[tuple[str, str]]:
    """(size, variant) of every row with no trial waiting or running (`finished_run`'s trial, whose run
    has ended and which is told next, counts as finished)."""
    from optuna.trial import TrialState

    busy = set()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING)):
        if finished_run and trial.user_attrs.get("mlflow_run_id") == finished_run:
            continue
        plan = json.loads(trial.user_attrs.get("plan") or "{}")
        busy.add((plan.get("size", ""), plan.get("variant", "?")))
    return {(r.size, r.variant) for r in records} - busy


def note(references: dict[str, str], labels: dict[str, str], one_seed: list[str]) -> str:
    """The parent run's description: what its series are (the UI shows it on the run's page)."""
    refs = ", ".join(f"{labels.get(v, v)}" + (f" at {s}" if s else "") for s, v in sorted(references.items()))
    text = (
        f"Paired differences, each row minus the reference ({refs}), over seeds, against training tokens "
        "(MLflow's step): diff/<metric>/<row>/mean with low and high, the ends of its 95% paired-t "
        "interval (ablate.report.ui_differences); budget/val/loss/<row>/...: each budget's difference."
    )
    if one_seed:
        text += f" One seed, no interval (n=1), so no low/high series: {', '.join(one_seed)}."
    return text


def paint(client: Any, parent: str, order: list[str], records: list[RunRecord]) -> None:
    """Each run its row's colour in the UI (ablate.store.comparison), set as the runs end, so a report's
    export, written after them, holds the tags `ablate ui` would otherwise add later."""
    colors = row_colors(order)
    wanted = {r.run_id: colors[r.variant] for r in records if r.run_id and r.variant in colors}
    wanted[parent] = PARENT_COLOR
    for run_id, color in wanted.items():
        set_tags(client, run_id, {COLOR_TAG: color})


def log_differences(ctx: SweepContext, study: Any, finished_run: str = "") -> int:
    """Write the differences of every settled row not yet on the parent run; returns the points written.
    `finished_run`: the MLflow run of a trial that has ended but is not told yet (a worker's after-trial
    step), counted as finished."""
    from mlflow.entities import Metric

    parent = study.user_attrs.get("mlflow_parent_run_id")
    if not parent or not ctx.stores.writes_records:
        return 0
    client = ctx.stores.client()
    order = list(ctx.recipe.variants)
    budgeted = ctx.recipe.budgets(ctx.scale) is not None
    records = collect(ctx, study, with_curves=False, budgets=budgeted)
    for r in records:
        if finished_run and r.run_id == finished_run:  # read as finished: its final metrics (collect's way)
            r.state = "finished"
            metrics = client.get_run(finished_run).data.metrics
            r.values.update({name: metrics.get(key, math.nan) for name, key in METRICS})
    if any(r.searched for r in records):
        records, _ = best_per_variant(records)  # the points the report's table shows
    settled = settled_rows(study, records, finished_run)
    series, references, one_seed = difference_series(client, order, records, settled)
    if budgeted:
        series.update(budget_series(order, records, row_labels(ctx), settled))
    logged = client.get_run(parent).data.metrics
    now = int(time.time() * 1000)
    new = []
    for key, points in sorted(series.items()):
        done = {m.step for m in client.get_metric_history(parent, key)} if key in logged else set()
        new += [Metric(key, float(v), now, int(t)) for t, v in sorted(points.items()) if t not in done]
    for start in range(0, len(new), BATCH):  # MLflow takes at most 1000 metrics a request
        client.log_batch(parent, metrics=new[start : start + BATCH])
    tags = {ORDER_TAG: json.dumps(order)}
    if references:
        tags[REFERENCE_TAG] = json.dumps(references, sort_keys=True)
        tags[ONE_SEED_TAG] = json.dumps(one_seed)
        tags[NOTE_TAG] = note(references, row_labels(ctx), one_seed)
    set_tags(client, parent, tags)
    paint(client, parent, order, records)
    return len(new)
