"""What a committed report's files say twice, they say alike: a budgeted study's table stars (summary.csv)
survive Holm exactly where its budget report's do (gap_vs_tokens.csv: one family, every row at every
budget), and the code versions its README header names are those of every run in its export. Folders with
an export only: the report verb rewrites those (`ablate report --from`); a folder without one keeps what
the report code of its day wrote (table6-cpu-tokens-four-rows: its README says which family each
statement uses)."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPORTS = Path(__file__).resolve().parents[2] / "reports"
BUDGETED = sorted(
    p for p in REPORTS.iterdir() if (p / "gap_vs_tokens.csv").is_file() and (p / "runs.parquet").is_file()
)
EXPORTED = sorted(
    p for p in REPORTS.iterdir() if (p / "runs.parquet").is_file() and (p / "summary.csv").is_file()
)


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("folder", BUDGETED, ids=lambda p: p.name)
def test_a_budgeted_table_and_its_budget_report_correct_over_one_family(folder):
    gaps = {
        (g["variant"], g["size"], float(g["tokens"])): g["holm_survives"]
        for g in _rows(folder / "gap_vs_tokens.csv")
    }
    compared = 0
    for row in _rows(folder / "summary.csv"):
        key = (row["variant"], row["size"], float(row["tokens"]))
        if row["holm_survives"] and key in gaps:
            assert row["holm_survives"] == gaps[key], f"{folder.name}: {key}"
            compared += 1
    assert compared, f"{folder.name}: no row of the table is in gap_vs_tokens.csv"


@pytest.mark.parametrize("folder", EXPORTED, ids=lambda p: p.name)
def test_the_header_names_the_code_version_of_every_run_in_the_export(folder):
    runs = pq.read_table(folder / "runs.parquet").to_pylist()
    versions = {json.loads(r["tags"]).get("ablate.code_version") for r in runs} - {None, ""}
    line = next(
        x
        for x in (folder / "README.md").read_text().splitlines()
        if x.startswith("- code version of the runs:")
    )
    assert set(re.findall(r"`([^`]+)`", line)) == versions
