"""The MLflow UI link that opens a study as a comparison of its variants.

MLflow's runs page restores a view from an experiment tag `mlflow.sharedViewState.<key>` when its URL
carries `viewStateShareKey=<key>` (the UI's own "Share" button writes such tags): the columns, the sort,
the search filter, the run grouping and the chart layout. `save_view` writes that tag for a study and
`view_url` is the link to it, with `workflowType=machine_learning` so the UI shows its model-training
pages whatever workflow the browser used last (MLflow 3 starts in its GenAI workflow), and
`compareRunsMode=CHART` for the chart view. The view:

- rows: the trials grouped by variant with the seeds averaged (MLflow's run grouping; every group
  expanded, so each seed's run is listed under it), in the order the runs started (the recipe's order
  when one worker trains them); the sweep's parent run under MLflow's "Additional runs";
- columns: the validation metrics (`val/loss` first), then the label and the seed;
- charts, two to a row: first the parent run's paired differences (`ablate.store.difference_charts`),
  then the validation and training metrics against training tokens (`tokens/<key>`,
  `ablate.store.tokens_axis`), every run drawn in its row's colour; a metric with the same value in every
  run (`val/ar_hit_share` on one validation set) is left out; MLflow's generated sections (against the
  step) follow.

A row's colour is its place in the recipe (`ablate.variants` on the parent run), the report plots'
palette (matplotlib's default cycle), so it is the same in every study of a recipe and no two of ten rows
are alike; MLflow keeps a run's colour in its `mlflow.runColor` tag (the colour picker writes it), and
a group of runs takes a colour hashed from its name, so the charts draw the runs, not the groups.

The tag's format is the UI's (MLflow 3.x bundle), not a documented API: `tests/e2e/test_ui_browser.py`
opens the link in a real browser and checks what it renders.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from ablate.store import names
from ablate.store.difference_charts import difference_charts, hidden_chart, step_chart
from ablate.store.difference_keys import ORDER_TAG, parse_key
from ablate.store.tokens_axis import PREFIX as TOKENS_PREFIX
from ablate.store.tracking import set_tags

VIEW_KEY = "ablate-comparison"
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
FIRST_METRICS = ("val/loss", "val/ar_hit", "val/others")  # Table 6's columns
SECTION = "val"  # MLflow's chart section of `val/...` metrics (the key up to its last '/')
RUN_NAME_COLUMN = "attributes.`Run Name`"
LABEL_COLUMN = f"tags.`{names.LABEL}`"
TRIALS_ONLY = f"tags.`{names.RUN_KEY}` LIKE '%'"  # every trial's run has one; the sweep's parent does not
PARENTS = f"tags.`{names.ROLE}` = '{names.SWEEP_ROLE}'"
COLOR_TAG = "mlflow.runColor"
# matplotlib's default colour cycle (tab10, "C0".."C9"): the report plots' colours (ablate.core.plot_style)
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
PARENT_COLOR = "#222222"  # the parent run's differences: near black, none of the rows' colours
TOKENS_SECTIONS = ("val", "train")  # sections of `tokens/<key>` charts, in this order
MAX_VIEW_CHARS = 20_000  # the longest experiment tag MLflow keeps (MAX_EXPERIMENT_TAG_VAL_LENGTH, 3.x)


def comparison_metrics(metric_keys: list[str] | set[str]) -> list[str]:
    """The study's validation metrics: Table 6's three first, then the rest of `val/...` sorted."""
    found = set(metric_keys)
    first = [key for key in FIRST_METRICS if key in found]
    return first + sorted(key for key in found if key.startswith(SECTION + "/") and key not in first)


def row_colors(order: list[str]) -> dict[str, str]:
    """Variant -> colour, by its place in the recipe's order (as `ablate.core.plot_style.variant_colors`)."""
    return {variant: PALETTE[i % len(PALETTE)] for i, variant in enumerate(order)}


def flat_metrics(runs: list[Any]) -> set[str]:
    """The validation metrics whose final value is the same in every run that has it (two runs at least):
    measured on one held-out set, such a metric (`val/ar_hit_share`, a share of its tokens) is a flat line
    that compares nothing."""
    values: dict[str, set[float]] = {}
    counts: dict[str, int] = {}
    for run in runs:
        for key, value in run.data.metrics.items():
            if not key.startswith(SECTION + "/"):
                continue
            values.setdefault(key, set()).add(round(value, 12))
            counts[key] = counts.get(key, 0) + 1
    return {key for key, seen in values.items() if len(seen) == 1 and counts[key] > 1}


def tokens_charts(keys: list[str], flat: set[str]) -> tuple[list[dict], list[dict]]:
    """(sections, charts) of the trials' metrics against training tokens: `val` then `train`, the
    validation metrics in the table's order; flat metrics left out (their charts deleted)."""
    sections, charts = [], []
    for name in TOKENS_SECTIONS:
        base = [k[len(TOKENS_PREFIX) :] for k in keys if k.startswith(TOKENS_PREFIX)]
        mine = [k for k in base if k.startswith(name + "/")]
        ordered = comparison_metrics(mine) if name == SECTION else sorted(mine)
        shown = [k for k in ordered if k not in flat]
        section = f"ablate-section-{name}-tokens"
        for metric in shown:
            key = TOKENS_PREFIX + metric
            charts.append(step_chart(f"ablate-{key}", key, f"{metric} against training tokens", section))
        charts += [hidden_chart(TOKENS_PREFIX + k) for k in ordered if k in flat]
        if shown:
            sections.append(
                {
                    "uuid": section,
                    "name": f"{name} against training tokens",
                    "display": True,
                    "isReordered": True,
                    "deleted": False,
                    "isGenerated": False,
                    "columns": 2,
                    "cardHeight": 360,
                }
            )
    return sections, charts


def view_state(
    metrics: list[str],
    variants: list[str],
    charts: tuple[list[dict], list[dict]] = ([], []),
    flat: set[str] = frozenset(),
) -> dict[str, Any]:
    """The runs page's state: search facets and UI state, as the UI's shared-view tag holds them;
    `charts`: the (sections, charts) drawn first; `flat`: metrics whose charts are left out."""
    sections, first = charts
    hidden = [hidden_chart(key) for key in sorted(flat)]
    columns = [f"metrics.`{m}`" for m in metrics] + [LABEL_COLUMN, f"tags.`{names.SEED}`"]
    return {
        "searchFilter": "",
        "orderByKey": "attributes.start_time",
        "orderByAsc": True,
        "selectedColumns": columns,
        "columnOrder": [RUN_NAME_COLUMN, *columns],  # the grid sorts a group's columns by name otherwise
        # "diff_lambda_05-s0", "Group: diff_lambda_05" and "Transformer [transformer_d256]" uncut
        "columnWidths": {RUN_NAME_COLUMN: 280, LABEL_COLUMN: 240},
        "groupBy": {
            "aggregateFunction": "average",
            "groupByKeys": [{"mode": "tag", "groupByData": names.VARIANT}],
        },
        # every variant's group, and MLflow's group of the runs without the tag (the parent: its charts)
        "groupsExpanded": {
            **{f"tag.{names.VARIANT}.{variant}": True for variant in variants},
            f"tag.{names.VARIANT}": True,
        },
        "useGroupedValuesInCharts": False,  # each run in its row's colour (a group's colour is hashed)
        "runsHiddenMode": "SHOW_ALL",
        "compareRunSections": sections,
        "compareRunCharts": first + hidden,
        "isAccordionReordered": True,
        "hideEmptyCharts": True,
    }


def save_view(client, experiment_id: str) -> None:
    """Write the comparison view of an experiment's runs as its shared-view tag, and each trial's run its
    row's colour (rewritten on every call, so it follows the metrics, rows and differences logged since)."""
    runs = client.search_runs(
        [experiment_id], filter_string=TRIALS_ONLY, order_by=["attributes.start_time ASC"]
    )
    parents = client.search_runs([experiment_id], filter_string=PARENTS)
    keys = {key for run in runs for key in run.data.metrics}
    metrics = comparison_metrics(keys)
    variants = [v for v in dict.fromkeys(run.data.tags.get(names.VARIANT, "") for run in runs) if v]
    order = next((json.loads(p.data.tags[ORDER_TAG]) for p in parents if ORDER_TAG in p.data.tags), [])
    order += [v for v in variants if v not in order]
    colors = row_colors(order)
    for run in runs + parents:
        color = colors.get(run.data.tags.get(names.VARIANT, ""), PARENT_COLOR)
        if color:
            set_tags(client, run.info.run_id, {COLOR_TAG: color}, current=run.data.tags)
    labels = {run.data.tags.get(names.VARIANT, ""): run.data.tags.get(names.LABEL, "") for run in runs}
    flat = flat_metrics(runs)
    diff_sections, diff_charts = difference_charts(
        parents, {v: lab for v, lab in labels.items() if lab}, order
    )
    token_sections, token_charts = tokens_charts(sorted(keys), flat)
    for charts in fewer_charts(diff_sections + token_sections, diff_charts + token_charts):
        text = json.dumps(view_state(metrics, variants, charts, flat), separators=(",", ":"))
        if len(text) <= MAX_VIEW_CHARS:
            break
    client.set_experiment_tag(experiment_id, VIEW_TAG_PREFIX + VIEW_KEY, text)


def fewer_charts(sections: list[dict], charts: list[dict]) -> Iterator[tuple[list[dict], list[dict]]]:
    """The view's (sections, charts), then each smaller one to try when the tag would be longer than MLflow
    keeps (a table of many rows has a chart per row and metric, and one deleted per series): without the
    deleted charts of the differences' series (MLflow then draws each of them in its generated sections),
    then only `val/loss`'s differences, then no deleted chart at all, then no tokens charts, then none."""

    def difference(chart: dict) -> bool:
        return parse_key(chart.get("metricKey", "")) is not None

    def loss(chart: dict) -> bool:
        return (parse_key(chart.get("metricKey", "")) or ("", ""))[1] == FIRST_METRICS[0]

    yield sections, charts
    charts = [c for c in charts if not (difference(c) and c.get("deleted"))]
    yield sections, charts
    charts = [c for c in charts if not difference(c) or loss(c)]
    yield sections, charts
    charts = [c for c in charts if not c.get("deleted")]
    yield sections, charts
    charts = [c for c in charts if difference(c)]
    yield [s for s in sections if s["uuid"] in {c["metricSectionId"] for c in charts}], charts
    yield [], []


def view_url(ui_url: str, experiment_id: str, charts: bool = True) -> str:
    """The runs page of an experiment in the comparison view (the UI routes after '#')."""
    query = f"workflowType=machine_learning&viewStateShareKey={VIEW_KEY}"
    if charts:
        query += "&compareRunsMode=CHART"
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs?{query}"
