"""The MLflow UI's comparison view, its pieces on a real MLflow store: the colours, metrics against tokens,
the differences with one seed (no band)."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from ablate.report import ui_differences
from ablate.report.table import RunRecord
from ablate.store import comparison, difference_keys, tokens_axis
from ablate.store.stores import Stores


@pytest.fixture
def client(tmp_path):
    return Stores(tmp_path / "ws").client()


def _run(client, name: str = "r") -> str:
    experiment = client.create_experiment(f"e-{name}")
    return client.create_run(experiment, run_name=name).info.run_id


def test_row_colours_are_the_report_plots_and_no_two_alike():
    from matplotlib.colors import to_hex, to_rgb

    order = [f"v{i}" for i in range(10)]
    colors = comparison.row_colors(order)
    assert [colors[v] for v in order] == [to_hex(f"C{i}") for i in range(10)]  # plot_style.variant_colors
    closest = min(
        math.dist(to_rgb(colors[a]), to_rgb(colors[b])) for a, b in itertools.combinations(order, 2)
    )
    assert closest > 0.25, closest  # RGB distance in [0, sqrt(3)]


def test_metrics_are_logged_again_against_tokens(client):
    run_id = _run(client)
    tokens_axis.log_metrics(client, run_id, {"val/loss": 4.5, "lr": 1e-3, "tokens": 4096.0}, step=8)
    tokens_axis.log_metrics(client, run_id, {"val/loss": 4.0, "tokens": 8192.0, "x": math.nan}, step=16)
    tokens_axis.log_metrics(client, run_id, {"compile_s": 2.0}, step=16)  # no tokens: no copy
    history = {
        key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
        for key in (
            "val/loss",
            "tokens/val/loss",
            "tokens/lr",
            "tokens/tokens",
            "tokens/compile_s",
            "tokens/x",
        )
    }
    assert history == {
        "val/loss": [(8, 4.5), (16, 4.0)],
        "tokens/val/loss": [(4096, 4.5), (8192, 4.0)],
        "tokens/lr": [(4096, 1e-3)],
        "tokens/tokens": [],
        "tokens/compile_s": [],
        "tokens/x": [],
    }


def test_flat_validation_metrics_are_left_out(client):
    ids = [_run(client, f"r{i}") for i in range(2)]
    for i, run_id in enumerate(ids):
        client.log_metric(run_id, "val/ar_hit_share", 0.319)
        client.log_metric(run_id, "val/loss", 4.0 + i)
        client.log_metric(run_id, "lr", 0.0)  # not a validation metric: kept
    runs = [client.get_run(run_id) for run_id in ids]
    assert comparison.flat_metrics(runs) == {"val/ar_hit_share"}
    assert comparison.flat_metrics(runs[:1]) == set()  # one run compares nothing, flat or not


def _record(client, variant: str, seed: int, curve: dict[int, float]) -> RunRecord:
    run_id = _run(client, f"{variant}-{seed}")
    for step, (tokens, value) in enumerate(sorted(curve.items()), start=1):
        client.log_metric(run_id, "val/loss", value, step=step)
        client.log_metric(run_id, "tokens", tokens, step=step)
    return RunRecord(variant=variant, seed=seed, size="", state="finished", run_id=run_id)


def test_one_seed_gives_the_mean_without_a_band(client):
    records = [
        _record(client, "base", 0, {100: 5.0, 200: 4.0}),
        _record(client, "row", 0, {100: 4.5, 200: 3.75}),
    ]
    series, references, one_seed = ui_differences.difference_series(
        client, ["base", "row"], records, {("", "row")}
    )
    assert series == {"diff/val/loss/row/mean": {100: -0.5, 200: -0.25}}
    assert references == {"": "base"} and one_seed == ["row"]
    text = ui_differences.note(references, {"base": "Base", "row": "Row"}, one_seed)
    assert "One seed, no interval (n=1), so no low/high series: row." in text


def test_a_row_not_settled_is_not_written(client):
    records = [_record(client, v, s, {100: 5.0 - s}) for v in ("base", "row") for s in (0, 1)]
    series, _, _ = ui_differences.difference_series(client, ["base", "row"], records, set())
    assert series == {}


def test_series_keys_read_back():
    key = difference_keys.series_key("diff", "val/loss", difference_keys.row_name("diff", "s64"), "low")
    assert key == "diff/val/loss/diff:s64/low"
    assert difference_keys.parse_key(key) == ("diff", "val/loss", "diff:s64", "low")
    assert difference_keys.split_row("diff:s64") == ("diff", "s64")
    assert difference_keys.parse_key("val/loss") is None
    assert difference_keys.parse_key("diff/val/loss/row/median") is None


def test_a_view_of_many_rows_fits_in_the_tag_mlflow_keeps_with_every_loss_difference_drawn(client):
    """Twelve rows, three metrics, a mean and an interval each: the full view is longer than MLflow's
    experiment tag; the saved view is the richest that fits, and still charts every row's val/loss
    difference and every tokens metric."""
    from mlflow.entities import Metric, RunTag

    from ablate.store import names

    experiment = client.create_experiment("many-rows")
    rows = [f"row_{i:02d}_with_a_long_name" for i in range(12)]
    parent = client.create_run(experiment, run_name="sweep").info.run_id
    series = [
        Metric(difference_keys.series_key("diff", metric, row, end), 0.1, 0, step)
        for metric in comparison.FIRST_METRICS
        for row in rows[1:]
        for end in ("mean", "low", "high")
        for step in (1000, 2000)
    ]
    client.log_batch(parent, metrics=series, tags=[RunTag(names.ROLE, names.SWEEP_ROLE)])
    client.set_tag(parent, difference_keys.REFERENCE_TAG, json.dumps({"": rows[0]}))
    for i, row in enumerate(rows):
        run = client.create_run(experiment, run_name=row).info.run_id
        tags = {names.RUN_KEY: row, names.VARIANT: row, names.LABEL: row.upper()}
        client.log_batch(
            run,
            metrics=[
                Metric(f"{tokens_axis.PREFIX}val/loss", 4 + i / 100, 0, 1000),
                Metric("val/loss", 4 + i / 100, 0, 1),
            ],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
    comparison.save_view(client, experiment)

    tag = client.get_experiment(experiment).tags[comparison.VIEW_TAG_PREFIX + comparison.VIEW_KEY]
    assert len(tag) <= comparison.MAX_VIEW_CHARS
    charts = json.loads(tag)["compareRunCharts"]
    drawn = {c["metricKey"] for c in charts if not c.get("deleted")}
    loss = {difference_keys.series_key("diff", "val/loss", row, "mean") for row in rows[1:]}
    assert loss <= drawn and f"{tokens_axis.PREFIX}val/loss" in drawn
    sizes = []
    for sections, tried in comparison.fewer_charts(*_all_charts(client, experiment)):
        sizes.append(
            len(json.dumps(comparison.view_state([], rows, (sections, tried)), separators=(",", ":")))
        )
    assert sizes[0] > comparison.MAX_VIEW_CHARS  # the full view would not have fitted
    assert sizes == sorted(sizes, reverse=True)  # each try smaller than the one before


def _all_charts(client, experiment: str) -> tuple[list[dict], list[dict]]:
    from ablate.store.difference_charts import difference_charts

    parents = client.search_runs([experiment], filter_string=comparison.PARENTS)
    return difference_charts(parents, {}, [])
