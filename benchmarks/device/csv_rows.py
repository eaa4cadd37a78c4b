"""The device check's files, each written whole: a lease cut (every process killed at any moment) leaves
the old file or the new one, never an empty or torn one. A file is written beside itself and renamed over
it (`os.replace` is atomic on one file system); rows are appended by rewriting the file so. Stdlib only:
check.py uses it before anything is installed."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path


def replace_text(path: Path, text: str) -> None:
    """`path` holds `text`, or what it held before, whenever the writer is killed."""
    part = path.with_name(f".{path.name}.part")
    with part.open("w", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, path)


def csv_text(rows: list[dict], columns: list[str], *, header: bool) -> str:
    """`rows` as CSV lines under `columns` (keys outside them ignored), the header line first if asked."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def write_rows(path: Path, rows: list[dict], columns: list[str]) -> None:
    """`path` is a CSV of `rows` under `columns`, its header first."""
    replace_text(path, csv_text(rows, columns, header=True))


def append_rows(path: Path, rows: list[dict], columns: list[str]) -> None:
    """Append `rows` to `path` under `columns`, the header first if the file is new (kept across runs)."""
    kept = path.read_text() if path.exists() else ""
    replace_text(path, kept + csv_text(rows, columns, header=not kept))
