"""A report's runs beside another folder's (ablate.report.compare_runs), checked against the committed exports
read here with pyarrow and intervals computed here with scipy, and the expected share read twice against a
simulation of windows drawn at random offsets."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from scipy import stats

from ablate.cli import main
from ablate.data.passes import read_twice
from ablate.report.compare_runs import compared_runs, runs_of

REPORTS = Path(__file__).resolve().parents[2] / "reports"


def _t(values: list[float]) -> tuple[float, float, float]:
    x = np.asarray(values, dtype=np.float64)
    half = stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return x.mean(), x.mean() - half, x.mean() + half


def _final_losses(folder: Path, tokens: int) -> dict[tuple[str, int, str], float]:
    """(variant, seed, non-embedding params) -> final val/loss of each finished run of `tokens` tokens."""
    out: dict[tuple[str, int, str], float] = {}
    for row in pq.read_table(folder / "runs.parquet").to_pylist():
        tags = json.loads(row["tags"])
        budget = tags.get("ablate.budget_tokens") or tags.get("ablate.tokens")
        if row["status"] != "FINISHED" or int(budget) != tokens:
            continue
        key = (tags["ablate.variant"], int(tags["ablate.seed"]), tags["ablate.non_embedding_params"])
        assert key not in out, f"two runs of {key} in {folder.name}"
        out[key] = json.loads(row["metrics"])["val/loss"]
    return out


def test_standard_against_mup_at_s128_recomputed_from_the_two_exports():
    standard_folder, mup_folder = REPORTS / "table6-cpu-tokens-pypi", REPORTS / "scaling-cpu-mup"
    rows = compared_runs(runs_of(standard_folder), runs_of(mup_folder))
    at = {(r["variant"], r["tokens"]): r for r in rows}
    standard, mup = _final_losses(standard_folder, 2097152), _final_losses(mup_folder, 2097152)
    seeds = [0, 1, 2]
    expected = {}
    for arch in ("transformer", "diff"):
        params = {p for (v, _, p) in standard if v == arch}
        assert len(params) == 1
        (p,) = params
        expected[arch] = {s: (standard[(arch, s, p)], mup[(arch, s, p)]) for s in seeds}
        change = _t([a - b for a, b in expected[arch].values()])
        row = at[(arch, 2097152.0)]
        assert row["seeds"] == 3 and row["same_data"] == "yes" and row["params"] == float(p)
        assert (row["loss_change"], row["loss_change_lo"], row["loss_change_hi"]) == pytest.approx(
            change, rel=1e-9
        )
    gap_standard = _t([expected["diff"][s][0] - expected["transformer"][s][0] for s in seeds])
    gap_mup = _t([expected["diff"][s][1] - expected["transformer"][s][1] for s in seeds])
    row = at[("diff", 2097152.0)]
    assert (row["gap"], row["gap_lo"], row["gap_hi"]) == pytest.approx(gap_standard, rel=1e-9)
    assert (row["compared_gap"], row["compared_gap_lo"], row["compared_gap_hi"]) == pytest.approx(
        gap_mup, rel=1e-9
    )
    # the numbers the READMEs quote, at their three decimals
    rounded = lambda xs: [round(x, 3) for x in xs]  # noqa: E731
    change_t = _t([a - b for a, b in expected["transformer"].values()])
    change_d = _t([a - b for a, b in expected["diff"].values()])
    assert rounded(change_t) == [0.139, 0.112, 0.166] and rounded(change_d) == [0.318, 0.253, 0.384]
    assert rounded(gap_standard) == [0.165, 0.066, 0.263] and rounded(gap_mup) == [-0.014, -0.035, 0.006]


def test_runs_on_different_corpora_are_set_side_by_side_but_their_losses_not_subtracted():
    rows = compared_runs(runs_of(REPORTS / "table6-cpu-tokens-pypi"), runs_of(REPORTS / "table6-cpu-tokens"))
    assert rows and all(r["same_data"] == "no" and math.isnan(r["loss_change"]) for r in rows)
    diff = {r["tokens"]: r for r in rows if r["variant"] == "diff"}
    assert set(diff) == {524288.0 * 2**k for k in range(6)}
    with open(REPORTS / "table6-cpu-tokens" / "gap_vs_tokens.csv", newline="") as f:
        stdlib = {float(r["tokens"]): float(r["gap"]) for r in csv.DictReader(f) if r["variant"] == "diff"}
    for tokens, row in diff.items():  # the other folder's own paired gap, from its own report
        assert row["compared_gap"] == pytest.approx(stdlib[tokens], rel=1e-9, abs=1e-12)


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_runs_pair_by_variant_seed_and_budget_and_by_shape_and_lr_where_both_know_them(tmp_path):
    rng = np.random.default_rng(7)
    loss = {
        (v, s, lr): float(rng.normal(3.5, 0.2))
        for v in ("transformer", "diff")
        for s in range(3)
        for lr in (1e-3, 3e-3)
    }
    table = [
        {
            "variant": v,
            "size": "",
            "seed": s,
            "state": "finished",
            "valid": x,
            "base.train.lr": lr,
            "mlflow_run_id": "",
        }
        for (v, s, lr), x in loss.items()
    ]
    table.append({**table[0], "seed": 9, "state": "failed", "valid": "nan"})
    _write(tmp_path / "a" / "table.csv", table)
    _write(
        tmp_path / "a" / "summary.csv", [{"variant": v, "tokens": 2048000} for v in ("transformer", "diff")]
    )
    other = {(v, s): float(rng.normal(3.0, 0.2)) for v in ("transformer", "diff") for s in range(2)}
    points = [
        {
            "arch": v,
            "size": size,
            "seed": s,
            "params": 1000 * (i + 1),
            "tokens": 2048000,
            "passes": 0.5,
            "loss": x + i,
        }
        for (v, s), x in other.items()
        for i, size in enumerate(("s64", "s128"))
    ]
    _write(tmp_path / "b" / "points.csv", points)
    rows = compared_runs(runs_of(tmp_path / "a"), runs_of(tmp_path / "b"))
    # neither lr nor shape is known on both sides, so each run here matches two there (two sizes): none is paired
    assert rows == []
    points = [p for p in points if p["size"] == "s128"]
    _write(tmp_path / "b" / "points.csv", points)
    rows = compared_runs(runs_of(tmp_path / "a"), runs_of(tmp_path / "b"))
    assert [(r["variant"], r["lr"], r["seeds"]) for r in rows] == [
        ("transformer", 1e-3, 2),
        ("transformer", 3e-3, 2),
        ("diff", 1e-3, 2),
        ("diff", 3e-3, 2),
    ]
    for r in rows:
        assert r["same_data"] == "no" and math.isnan(r["loss_change"])  # no export: the data are not known
        assert r["compared_size"] == "s128" and r["compared_passes"] == 0.5
        if r["variant"] == "diff":
            here = _t([loss[("diff", s, r["lr"])] - loss[("transformer", s, r["lr"])] for s in range(2)])
            there = _t([other[("diff", s)] - other[("transformer", s)] for s in range(2)])
            assert (r["gap"], r["gap_lo"], r["gap_hi"]) == pytest.approx(here, rel=1e-9)
            assert (r["compared_gap"], r["compared_gap_lo"], r["compared_gap_hi"]) == pytest.approx(
                there, rel=1e-9
            )
            assert r["gap_change"] == pytest.approx(here[0] - there[0], rel=1e-9)


def _simulated_share_read_twice(
    passes: float, rng: np.random.Generator, split: int = 2_000_000, window: int = 16
) -> float:
    """Windows at uniform random offsets of a split: the share of the tokens read that had been read before."""
    n = int(round(passes * split / window))
    starts = rng.integers(0, split - window + 1, size=n)
    counts = np.zeros(split + 1, dtype=np.int64)
    np.add.at(counts, starts, 1)
    np.add.at(counts, starts + window, -1)
    reads = np.cumsum(counts)[:split]
    return float((reads.sum() - np.count_nonzero(reads)) / reads.sum())


@pytest.mark.parametrize("passes", [0.1, 0.6, 1.2])
def test_the_expected_share_read_twice_matches_windows_drawn_at_random_offsets(passes):
    simulated = _simulated_share_read_twice(passes, np.random.default_rng(0))
    assert read_twice(passes, "random") == pytest.approx(simulated, abs=0.01)


def test_the_share_read_twice_the_reports_quote_and_without_replacement():
    assert [round(100 * read_twice(p, "random"), 1) for p in (0.0125, 0.026, 0.10, 0.1023)] == [
        0.6,
        1.3,
        4.8,
        4.9,
    ]
    assert [round(100 * read_twice(p, "random")) for p in (0.6, 1.2)] == [25, 42]
    assert read_twice(0.5, "permutation") == 0.0 and read_twice(2.0, "permutation") == 0.5
    assert math.isnan(read_twice(math.nan, "random")) and read_twice(0.0, "random") == 0.0


def _one_line(code: int, err: str, *fragments: str) -> None:
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert all(f in err for f in fragments), err


def test_compare_with_a_folder_that_lists_no_runs_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code = main(["report", "recipes/table6.yaml", "--compare-with", str(tmp_path / "empty")])
    _one_line(code, capsys.readouterr().err, "--compare-with:", "table.csv")
    code = main(["report", "--from", str(tmp_path / "empty"), "--compare-with", "reports/table6-cpu"])
    _one_line(code, capsys.readouterr().err, "give no recipe, --compare-with")
