"""A budgeted study's prediction (ablate.report.predict): rows whose losses follow known curves L(D) = E +
B D^-beta exactly give, at a larger token count, the gap of those curves; a row whose loss falls
linearly in log tokens (no such curve with E >= 0 fits it) is flagged with E at its bound; predictions set beside measured gaps say whether each held."""

from __future__ import annotations

import csv
import math
import re
import subprocess
import sys

import pytest

from ablate.report import stats
from ablate.report.predict import against_measured, predict

CURVES = {  # variant -> (E, B, beta)
    "transformer": (2.0, 40.0, 0.30),
    "diff": (1.9, 60.0, 0.32),
}
STRAIGHT = "diff_no_gn"  # 4.3 - 0.4 log2(D / 2^19): no curve, E pinned at 0
BUDGETS = [1 << 19, 1 << 20, 1 << 21, 1 << 22]


def _loss(variant: str, tokens: float) -> float:
    if variant == STRAIGHT:
        return 4.3 - 0.4 * math.log2(tokens / (1 << 19))
    e, b, beta = CURVES[variant]
    return e + b * tokens**-beta


def _write_budgets(path):
    fields = ["variant", "label", "seed", "tokens", "state", "valid"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for variant in [*CURVES, STRAIGHT]:
            for seed in (0, 1, 2):
                for tokens in BUDGETS:
                    row = dict(variant=variant, label=variant.title(), seed=seed, tokens=tokens)
                    writer.writerow({**row, "state": "finished", "valid": _loss(variant, tokens)})
            writer.writerow(
                dict(variant=variant, label="x", seed=3, tokens=1 << 22, state="failed", valid="nan")
            )
    return path


def test_the_fitted_gap_at_a_larger_budget_is_the_curves_gap(tmp_path):
    rows = predict(_write_budgets(tmp_path / "budgets.csv"), [1 << 23, 1 << 24], n_boot=20)
    assert [(r["variant"], r["tokens"]) for r in rows] == [
        ("diff", 1 << 23),
        ("diff", 1 << 24),
        ("diff_no_gn", 1 << 23),
        ("diff_no_gn", 1 << 24),
    ]
    for r in rows[:2]:
        truth = _loss(r["variant"], r["tokens"]) - _loss("transformer", r["tokens"])
        assert r["predicted_gap"] == pytest.approx(truth, abs=2e-3), r
    for r in rows:
        assert r["n_seeds"] == 3 and r["fitted_budgets"] == " ".join(map(str, BUDGETS))
        assert r["predicted_lo"] <= r["predicted_gap"] <= r["predicted_hi"]
    assert rows[0]["at_bound"] == ""
    assert rows[2]["at_bound"] == "Diff_No_Gn: E at its lower bound 0"


def test_a_prediction_held_when_the_measured_mean_is_inside_its_interval():
    predictions = [
        {"variant": "diff", "label": "Diff", "tokens": "8388608", "predicted_gap": "-0.05"}
        | {"predicted_lo": "-0.11", "predicted_hi": "-0.03", "at_bound": ""},
        {"variant": "diff", "label": "Diff", "tokens": "16777216", "predicted_gap": "-0.2"}
        | {"predicted_lo": "-0.3", "predicted_hi": "-0.14", "at_bound": ""},
        {"variant": "gn", "label": "GN", "tokens": "8388608", "predicted_gap": "-0.08"}
        | {"predicted_lo": "-0.13", "predicted_hi": "0.006", "at_bound": "GN: E at its lower bound 0"},
    ]
    gaps = [
        {"variant": "diff", "tokens": 8388608, "gap": -0.04, "lo": -0.08, "hi": 0.0, "n_seeds": 3},
        {"variant": "diff", "tokens": 16777216, "gap": -0.02, "lo": -0.05, "hi": 0.01, "n_seeds": 3},
    ]
    rows = against_measured(predictions, gaps)
    assert [r["held"] for r in rows] == ["true", "false", ""]
    assert rows[1]["measured_gap"] == -0.02 and math.isnan(rows[2]["measured_gap"])
    assert rows[2]["at_bound"] == "GN: E at its lower bound 0"


def test_the_command_refuses_a_missing_file_in_one_line(tmp_path):
    cmd = [sys.executable, "-m", "ablate.report.predict", str(tmp_path / "nope.csv"), "--at", "8388608"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0
    assert done.stderr.startswith("budgets_csv: no file")


def test_the_budget_report_sets_the_predictions_beside_the_measured_gaps(tmp_path):
    from ablate.report.budgets import _predictions_section
    from ablate.report.predict import write_predictions

    assert _predictions_section(tmp_path, []) is None  # no predictions written: no section
    rows = predict(_write_budgets(tmp_path / "budgets.csv"), [1 << 23], n_boot=20)
    write_predictions(rows, tmp_path / "predictions.csv")
    measured = {"variant": "diff", "tokens": 1 << 23, "gap": rows[0]["predicted_gap"], "n_seeds": 3}
    text, checked = _predictions_section(tmp_path, [measured | {"lo": -1.0, "hi": 1.0}])
    assert [r["held"] for r in checked] == ["true", ""]
    assert "## Predicted before the runs, and measured" in text
    assert (
        re.search(r"\| held +\|", text)
        and "| not measured (fit: Diff_No_Gn: E at its lower bound 0) |" in text
    )
    assert f"| {stats.format_number(rows[0]['predicted_gap'], sign=True)} [" in text


def test_the_budget_reports_extrapolation_is_not_quoted_when_a_fit_sits_at_a_bound():
    from ablate.report.budget_gaps import doubling_rows, trend_rows
    from ablate.report.budgets import trend_sentence
    from ablate.report.run_records import RunRecord

    order = ["transformer", "diff", STRAIGHT]
    labels = {v: v.title() for v in order}
    records = [
        RunRecord(
            variant=v,
            seed=s,
            size="",
            state="finished",
            run_id=f"{v}-{s}-{t}",
            values={"valid": _loss(v, t)},
            tags={"ablate.tokens": str(t)},
        )
        for v in order
        for s in (0, 1, 2)
        for t in BUDGETS
    ]
    rows = trend_rows(order, records, labels, doubling_rows(order, records, labels))
    curved, straight = rows
    assert curved["extrapolation_at_bound"] == "" and straight["extrapolation_at_bound"] == (
        "Diff_No_Gn: E at its lower bound 0"
    )
    for row in rows:
        row["reference_label"], row["_gap_sign"] = "Transformer", 1.0
    quoted = trend_sentence(curved, None)
    assert re.search(r"Extrapolation \(fitted .*\): [−+]\d", quoted), quoted
    withheld = trend_sentence(straight, None)
    assert "not quoted" in withheld and "E at its lower bound 0" in withheld
    assert f"{straight['extrapolated_gap']:+.3f}".replace("-", "−") not in withheld
