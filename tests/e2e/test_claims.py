"""A prediction written before the runs (`claims.csv` in a report folder) is set beside what they measured
(ablate.report.claims): `ablate report --from` on committed exports (a three-seed table and its lr grid),
each measured value checked against numbers this test computes from the report's per-run rows with its
own statistics."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
from mini_project import run_cli_here
from scipy import stats

from ablate.store.export import read_meta

ROOT = Path(__file__).resolve().parents[2]
TABLE, GRID = "table6-cpu-pypi", "table6-cpu-pypi-lr"  # 7 rows x 3 seeds; the lr grid it chose from


def _project(tmp_path: Path, name: str, claims: str) -> Path:
    for inputs in ("recipes", "sweeps"):  # the recipe and the search spec the exports name
        shutil.copytree(ROOT / inputs, tmp_path / inputs)
    for folder in [f"reports/{name}", *read_meta(ROOT / "reports" / name)["report"].get("compare_with", [])]:
        shutil.copytree(ROOT / folder, tmp_path / folder)
    (tmp_path / "reports" / name / "claims.csv").write_text(claims)
    return tmp_path / "reports" / name


def _valid_by_seed(folder: Path) -> dict[str, dict[int, float]]:
    with open(folder / "table.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["state"] == "finished"]
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        out.setdefault(r["variant"], {})[int(r["seed"])] = float(r["valid"])
    return out


def test_claims_are_measured_from_the_runs_and_each_says_whether_it_held(tmp_path):
    runs = _valid_by_seed(ROOT / "reports" / TABLE)
    t_mean = np.mean(list(runs["transformer"].values()))
    claims = (
        "claim,quantity,row,low,high\n"
        f"T near its mean,mean_loss,transformer,{t_mean - 0.01},{t_mean + 0.01}\n"
        f"T far below,mean_loss,transformer,0,{t_mean - 0.5}\n"
        "Diff-T holds 0,difference_holds,diff,0,0\n"
        "span under 1,span_of_means,,0,1\n"
        "best lr 3e-3,best_lr,transformer,0.003,0.003\n"
        "a row not in the table,mean_loss,nope,0,9\n"
    )
    folder = _project(tmp_path, TABLE, claims)
    proc = run_cli_here("report", "--from", f"reports/{TABLE}/", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    with open(folder / "claims_vs_measured.csv", newline="") as f:
        checked = {r["claim"]: r for r in csv.DictReader(f)}
    assert float(checked["T near its mean"]["measured"]) == pytest.approx(t_mean, abs=1e-12)
    assert [checked[c]["held"] for c in ("T near its mean", "T far below")] == ["yes", "no"]
    seeds = sorted(runs["transformer"])
    diffs = np.array([runs["diff"][s] - runs["transformer"][s] for s in seeds], dtype=np.float64)
    half = stats.t.ppf(0.975, len(diffs) - 1) * diffs.std(ddof=1) / np.sqrt(len(diffs))
    row = checked["Diff-T holds 0"]
    assert float(row["measured"]) == pytest.approx(diffs.mean(), abs=1e-12)
    assert float(row["measured_lo"]) == pytest.approx(diffs.mean() - half, rel=1e-9)
    assert float(row["measured_hi"]) == pytest.approx(diffs.mean() + half, rel=1e-9)
    assert row["held"] == ("yes" if diffs.mean() - half <= 0 <= diffs.mean() + half else "no")
    means = [np.mean(list(by_seed.values())) for by_seed in runs.values()]
    assert float(checked["span under 1"]["measured"]) == pytest.approx(max(means) - min(means), abs=1e-12)
    assert checked["span under 1"]["held"] == "yes"
    assert checked["best lr 3e-3"]["held"] == "unknown"  # no searched grid: nothing to measure it on
    assert checked["a row not in the table"]["held"] == "unknown"
    table = (folder / "table.md").read_text()
    assert "## Predicted before the runs, beside what they measured" in table
    held = sum(r["held"] == "yes" for r in checked.values())
    assert f"{held} of its 6 claims held" in table, table


def test_a_best_lr_claim_is_read_from_the_searched_grid(tmp_path):
    with open(ROOT / "reports" / GRID / "table.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["variant"] == "diff" and r["state"] == "finished"]
    best = float(min(rows, key=lambda r: float(r["valid"]))["base.train.lr"])  # one seed per grid point
    claims = (
        "claim,quantity,row,low,high\nbest at 3e-3,best_lr,diff,0.003,0.003\nat 1e-2,best_lr,diff,0.01,0.01\n"
    )
    folder = _project(tmp_path, GRID, claims)
    proc = run_cli_here("report", "--from", f"reports/{GRID}/", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    with open(folder / "claims_vs_measured.csv", newline="") as f:
        checked = list(csv.DictReader(f))
    assert [float(c["measured"]) for c in checked] == [best, best]
    assert [c["held"] for c in checked] == ["yes" if best == 0.003 else "no", "yes" if best == 0.01 else "no"]


def test_a_malformed_claim_is_one_line_and_nothing_is_rewritten(tmp_path):
    folder = _project(tmp_path, TABLE, "claim,quantity,row,low,high\nx,median_loss,diff,0,1\n")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    proc = run_cli_here("report", "--from", f"reports/{TABLE}/", cwd=tmp_path)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "claims.csv:2: quantity 'median_loss' is not one of best_lr, mean_loss" in line, line
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
