"""The MLflow UI link that opens a study as a comparison of its variants.

MLflow's runs page restores a view from an experiment tag `mlflow.sharedViewState.<key>` when its URL
carries `viewStateShareKey=<key>` (the UI's own "Share" button writes such tags): the columns, the sort,
the search filter, the run grouping and the chart layout. `save_view` writes that tag for a study and
`view_url` is the link to it, with `workflowType=machine_learning` so the UI shows its model-training
pages whatever workflow the browser used last (MLflow 3 starts in its GenAI workflow), and
`compareRunsMode=CHART` for the chart view. The view:

- rows: the trials only (the sweep's parent run is filtered out), grouped by variant with the seeds
  averaged (MLflow's run grouping; every group expanded, so each seed's run is listed under it), in the
  order the runs started (the recipe's order when one worker trains them);
- columns: the validation metrics (`val/loss` first), then the label and the seed;
- charts: a first section of the validation metrics, every run of the study on each chart (MLflow's
  generated charts show the 10 newest), one line per variant; the other metrics follow in MLflow's
  generated sections.

The tag's format is the UI's (MLflow 3.x bundle), not a documented API: `tests/e2e/test_ui_browser.py`
opens the link in a real browser and checks what it renders.
"""

from __future__ import annotations

import json
from typing import Any

VIEW_KEY = "ablate-comparison"
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
VARIANT_TAG = "ablate.variant"
FIRST_METRICS = ("val/loss", "val/ar_hit", "val/others")  # Table 6's columns
SECTION = "val"  # MLflow's chart section of `val/...` metrics (the key up to its last '/')
RUN_NAME_COLUMN = "attributes.`Run Name`"
LABEL_COLUMN = "tags.`ablate.label`"
TRIALS_ONLY = "tags.`ablate.run_key` LIKE '%'"  # every trial's run has one; the sweep's parent does not


def comparison_metrics(metric_keys: list[str] | set[str]) -> list[str]:
    """The study's validation metrics: Table 6's three first, then the rest of `val/...` sorted."""
    found = set(metric_keys)
    first = [key for key in FIRST_METRICS if key in found]
    return first + sorted(key for key in found if key.startswith(SECTION + "/") and key not in first)


def view_state(metrics: list[str], variants: list[str]) -> dict[str, Any]:
    """The runs page's state: search facets and UI state, as the UI's shared-view tag holds them."""
    charts = [
        {
            "uuid": f"ablate-{metric}",
            "type": "LINE",
            "metricKey": metric,
            "displayName": metric.rsplit("/", 1)[-1],
            "metricSectionId": f"ablate-section-{SECTION}",
            "runsCountToCompare": 100,
            "isGenerated": True,
            "deleted": False,
            "xAxisKey": "step",
            "useGlobalXaxisKey": True,
            "useGlobalLineSmoothing": True,
            "lineSmoothness": 0,
            "scaleType": "linear",
            "xAxisScaleType": "linear",
        }
        for metric in metrics
    ]
    section = {
        "uuid": f"ablate-section-{SECTION}",
        "name": SECTION,
        "display": True,
        "isReordered": True,
        "deleted": False,
        "isGenerated": True,
    }
    columns = [f"metrics.`{m}`" for m in metrics] + [LABEL_COLUMN, "tags.`ablate.seed`"]
    return {
        "searchFilter": TRIALS_ONLY,
        "orderByKey": "attributes.start_time",
        "orderByAsc": True,
        "selectedColumns": columns,
        "columnOrder": [RUN_NAME_COLUMN, *columns],  # the grid sorts a group's columns by name otherwise
        # "diff_lambda_05-s0", "Group: diff_lambda_05" and "Transformer [transformer_d256]" uncut
        "columnWidths": {RUN_NAME_COLUMN: 280, LABEL_COLUMN: 240},
        "groupBy": {
            "aggregateFunction": "average",
            "groupByKeys": [{"mode": "tag", "groupByData": VARIANT_TAG}],
        },
        "groupsExpanded": {f"tag.{VARIANT_TAG}.{variant}": True for variant in variants},
        "useGroupedValuesInCharts": True,
        "runsHiddenMode": "SHOW_ALL",
        "compareRunSections": [section],
        "compareRunCharts": charts,
        "isAccordionReordered": True,
        "hideEmptyCharts": True,
    }


def save_view(client, experiment_id: str) -> None:
    """Write the comparison view of an experiment's runs as its shared-view tag (one request each for
    the runs and the tag; rewritten on every call, so it follows the metrics and variants logged since)."""
    runs = client.search_runs(
        [experiment_id], filter_string=TRIALS_ONLY, order_by=["attributes.start_time ASC"]
    )
    metrics = comparison_metrics({key for run in runs for key in run.data.metrics})
    variants = list(dict.fromkeys(run.data.tags.get(VARIANT_TAG, "") for run in runs))
    state = view_state(metrics, [v for v in variants if v])
    client.set_experiment_tag(experiment_id, VIEW_TAG_PREFIX + VIEW_KEY, json.dumps(state))


def view_url(ui_url: str, experiment_id: str, charts: bool = False) -> str:
    """The runs page of an experiment in the comparison view (the UI routes after '#')."""
    query = f"workflowType=machine_learning&viewStateShareKey={VIEW_KEY}"
    if charts:
        query += "&compareRunsMode=CHART"
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs?{query}"
