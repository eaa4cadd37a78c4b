"""The paired differences on a sweep's parent run, read back through MLflow's API: the report's numbers
to the printed digit, every evaluation point against an independent paired-t in float64, against tokens."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from ablate.store.stores import Stores

pytestmark = pytest.mark.slow
METRICS = ("val/loss", "val/ar_hit", "val/others")


def _runs(workspace):
    client = Stores(workspace).client()
    experiment = client.get_experiment_by_name("mini")
    runs = client.search_runs([experiment.experiment_id])
    parent = next(r for r in runs if r.data.tags.get("ablate.role") == "sweep")
    trials = {
        (r.data.tags["ablate.variant"], int(r.data.tags["ablate.seed"])): r.info.run_id
        for r in runs
        if r.data.tags.get("ablate.role") != "sweep"
    }
    return client, parent, trials


def _history(client, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def _paired_t(a: list[float], b: list[float]) -> tuple[float, float, float]:
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    half = st.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
    return float(d.mean()), float(d.mean() - half), float(d.mean() + half)


def test_every_validation_metric_is_also_logged_against_tokens(finished_sweep):
    client, _, trials = _runs(finished_sweep)
    run_id = trials[("diff", 0)]
    tokens = _history(client, run_id, "tokens")
    for key in (*METRICS, "train/loss"):
        by_step = _history(client, run_id, key)
        against_tokens = _history(client, run_id, "tokens/" + key)
        assert by_step and against_tokens == {int(tokens[s]): v for s, v in by_step.items()}, key


def test_parent_run_carries_each_rows_paired_difference_at_every_evaluation_point(finished_sweep):
    client, parent, trials = _runs(finished_sweep)
    for metric in METRICS:
        mean = _history(client, parent.info.run_id, f"diff/{metric}/diff/mean")
        low = _history(client, parent.info.run_id, f"diff/{metric}/diff/low")
        high = _history(client, parent.info.run_id, f"diff/{metric}/diff/high")
        diff = [_history(client, trials[("diff", s)], "tokens/" + metric) for s in (0, 1)]
        ref = [_history(client, trials[("transformer", s)], "tokens/" + metric) for s in (0, 1)]
        points = sorted(diff[0])
        assert points == [1024, 2048], points  # validations every 4 steps of 256 tokens
        assert sorted(mean) == sorted(low) == sorted(high) == points
        for tokens in points:
            expected = _paired_t([d[tokens] for d in diff], [r[tokens] for r in ref])
            got = (mean[tokens], low[tokens], high[tokens])
            assert got == pytest.approx(expected, rel=1e-12, abs=1e-12), (metric, tokens)
    # The reference row has no difference of its own.
    assert not [k for k in parent.data.metrics if k.startswith("diff/") and "/transformer/" in k]


def test_the_last_point_is_the_reports_difference_to_the_printed_digit(finished_sweep):
    client, parent, _ = _runs(finished_sweep)
    table = (finished_sweep.parent / "reports" / "mini" / "table.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| Diff Transformer"))
    printed = [cell.strip() for cell in row.split("|")][-3]  # "Δ Valid vs row 1 (paired)"
    ends = {
        end: _history(client, parent.info.run_id, f"diff/val/loss/diff/{end}")
        for end in ("mean", "low", "high")
    }
    last = {end: values[max(values)] for end, values in ends.items()}

    def number(x: float, sign: bool = False) -> str:
        return (f"{x:+.3f}" if sign else f"{x:.3f}").replace("-", "\u2212")

    logged = f"{number(last['mean'], sign=True)} [{number(last['low'])}, {number(last['high'])}]"
    assert printed.startswith(logged), (printed, logged)


def test_the_reports_readme_names_the_series_the_parent_run_carries(finished_sweep):
    client, parent, _ = _runs(finished_sweep)
    readme = (finished_sweep.parent / "reports" / "mini" / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith("- in the MLflow UI:"))
    named = line.split("`")[1]  # diff/<metric>/<row>/mean
    for metric in METRICS:
        key = named.replace("<metric>", metric).replace("<row>", "diff")
        assert key in parent.data.metrics, (key, sorted(parent.data.metrics))
    assert "`low` and `high`" in line
