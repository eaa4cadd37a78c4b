"""Appending rows to a CSV file kept across runs into the same folder (its header written once), for the
device check's parts. Stdlib only: check.py uses it before anything is installed."""

from __future__ import annotations

import csv
from pathlib import Path


def append_rows(path: Path, rows: list[dict], columns: list[str]) -> None:
    """Append `rows` to `path` under `columns` (keys outside them ignored), the header first if it is new."""
    new = not path.exists()
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerows(rows)
