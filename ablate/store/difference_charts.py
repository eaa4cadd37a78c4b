"""The MLflow UI's charts of a sweep's paired differences (the parent run's series named in
`ablate.store.difference_keys`): one chart per row and validation metric, its mean difference with the two
ends of its 95% interval (three series of the parent run; the mean alone with one seed), against training
tokens, in a first section of the comparison view (`ablate.store.comparison`).

MLflow draws a band only around a group of runs (their min and max), never between two metrics of one
run: the interval's ends are its two lines on either side of the mean.
"""

from __future__ import annotations

import json
from typing import Any

from ablate.store.difference_keys import (
    BUDGET,
    ENDS,
    ONE_SEED_TAG,
    REFERENCE_TAG,
    parse_key,
    split_row,
)

SECTION = "ablate-section-differences"
FIRST_METRICS = ("val/loss", "val/ar_hit", "val/others")  # Table 6's columns
BUDGET_SECTION = "ablate-section-budgets"


def step_chart(uuid: str, key: str, title: str, section: str) -> dict[str, Any]:
    """MLflow's saved state of a line chart of `key` against its step (here the training tokens), every
    run drawn; the trials' tokens charts (`ablate.store.comparison`) are these."""
    return {
        "uuid": uuid,
        "type": "LINE",
        "metricKey": key,
        "displayName": title,
        "metricSectionId": section,
        "runsCountToCompare": 100,
        "isGenerated": False,
        "deleted": False,
        "xAxisKey": "step",
        "useGlobalXaxisKey": False,
        "useGlobalLineSmoothing": False,
        "lineSmoothness": 0,
        "scaleType": "linear",
        "xAxisScaleType": "linear",
    }


def line_chart(uuid: str, keys: list[str], title: str, section: str) -> dict[str, Any]:
    """A `step_chart` of several `keys` (a difference's mean and its interval's ends), points drawn."""
    return step_chart(uuid, keys[0], title, section) | {"selectedMetricKeys": keys, "displayPoints": True}


def hidden_chart(key: str) -> dict[str, Any]:
    """A chart MLflow would generate for `key`, deleted: its key is drawn elsewhere (or flat)."""
    return {
        "uuid": f"ablate-hidden-{key}",
        "type": "LINE",
        "metricKey": key,
        "deleted": True,
        "isGenerated": True,
    }


def difference_charts(
    parents: list[Any], labels: dict[str, str], order: list[str]
) -> tuple[list[dict], list[dict]]:
    """(sections, charts) of the parent runs' difference series: one chart per (kind, metric, row), in the
    metrics' order (val/loss first) and the rows' order; every series key charted once, MLflow's own
    generated chart of each key deleted."""
    rows: dict[tuple[str, str, str], list[str]] = {}
    references: dict[str, str] = {}
    one_seed: set[str] = set()
    for run in parents:
        tags = run.data.tags
        references.update(json.loads(tags.get(REFERENCE_TAG) or "{}"))
        one_seed |= set(json.loads(tags.get(ONE_SEED_TAG) or "[]"))
        for key in run.data.metrics:
            parsed = parse_key(key)
            if parsed:
                kind, metric, row, end = parsed
                rows.setdefault((kind, metric, row), []).append(end)
    charts, hidden, sections = [], [], []
    for (kind, metric, row), ends in rows.items():
        variant, size = split_row(row)
        reference = references.get(size, "the first row")
        name = labels.get(variant, variant) + (f" ({size})" if size else "")
        title = f"Δ {metric}: {name} − {labels.get(reference, reference)}"
        title += ", at each budget" if kind == BUDGET else ""
        if row in one_seed:
            title += " (n=1, no interval)"
        keys = [f"{kind}/{metric}/{row}/{end}" for end in ENDS if end in ends]
        section = BUDGET_SECTION if kind == BUDGET else SECTION
        charts.append(line_chart(f"ablate-{kind}-{metric}-{row}", keys, title, section))
        hidden += [hidden_chart(k) for k in keys]

    def place(chart: dict[str, Any]) -> tuple:
        kind, metric, row, _ = parse_key(chart["metricKey"])
        variant, size = split_row(row)
        rank = FIRST_METRICS.index(metric) if metric in FIRST_METRICS else len(FIRST_METRICS)
        return kind, rank, metric, size, order.index(variant) if variant in order else len(order), variant

    charts.sort(key=place)
    for uuid, name in (
        (SECTION, "paired differences vs the reference row, 95% interval over seeds"),
        (BUDGET_SECTION, "paired differences at each budget"),
    ):
        if any(c["metricSectionId"] == uuid for c in charts):
            sections.append(
                {
                    "uuid": uuid,
                    "name": name,
                    "display": True,
                    "isReordered": True,
                    "deleted": False,
                    "isGenerated": False,
                    "columns": 1,
                    "cardHeight": 360,
                }
            )
    return sections, charts + hidden
