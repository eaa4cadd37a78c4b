"""Fit inputs: one `Point` per (run, checkpoint); reading them from CSV; checking them."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ablate.core.errors import UserError

REQUIRED_COLUMNS = ("params", "tokens", "loss")


@dataclass(frozen=True)
class Point:
    """One measured loss. `params` is the model's parameter count N, `tokens` the training tokens D.

    `run_id` groups the points of one training run (its checkpoints); the bootstrap resamples whole runs.
    """

    arch: str
    params: float
    tokens: float
    loss: float
    run_id: str


def as_points(points: Iterable[Point | Mapping]) -> list[Point]:
    """Accept `Point`s or dicts with keys params, tokens, loss and optional arch, run_id."""
    out = []
    for i, p in enumerate(points):
        if isinstance(p, Point):
            out.append(p)
            continue
        missing = [k for k in REQUIRED_COLUMNS if k not in p]
        if missing:
            raise UserError(f"fit: point {i} has no '{missing[0]}'; a point needs params, tokens and loss")
        vals = {}
        for k in REQUIRED_COLUMNS:
            vals[k] = _positive_number(p[k], k, f"point {i}")
        out.append(
            Point(
                arch=str(p.get("arch") or "default"),
                run_id=str(p["run_id"]) if p.get("run_id") not in (None, "") else str(i),
                **vals,
            )
        )
    for i, p in enumerate(out):
        for k in REQUIRED_COLUMNS:
            _positive_number(getattr(p, k), k, f"point {i}")
    return out


def _positive_number(value, column: str, where: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UserError(f"fit: {where}: {column} = {value!r} is not a number") from None
    if not math.isfinite(v):
        raise UserError(
            f"fit: {where}: {column} = {value!r} is not finite; {column} must be a positive number"
        )
    if v <= 0:
        raise UserError(f"fit: {where}: {column} = {value!r} is not positive; {column} must be > 0")
    return v


def read_points_csv(path: str | Path) -> list[Point]:
    """Columns params, tokens, loss (required), arch (default "default"), run_id (default: row number).

    Rows are numbered from 1 after the header; errors name the row, its line in the file and the column.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as e:
        raise UserError(f"fit: cannot read --csv {path}: {e.strerror or e}") from None
    reader = csv.DictReader(text.splitlines())
    if reader.fieldnames is None:
        raise UserError(f"fit: {path} is empty; expected a header with columns params, tokens, loss")
    reader.fieldnames = [(f or "").strip().lower() for f in reader.fieldnames]
    for col in REQUIRED_COLUMNS:
        if col not in reader.fieldnames:
            raise UserError(
                f"fit: {path} has no column '{col}'; columns found: {', '.join(reader.fieldnames)}; "
                "required: params, tokens, loss (optional: arch, run_id)"
            )
    points = []
    for row_no, row in enumerate(reader, start=1):
        if all((v or "").strip() == "" for k, v in row.items() if k is not None):
            continue  # blank line
        where = f"{path} row {row_no} (line {reader.line_num})"
        vals = {c: _positive_number((row.get(c) or "").strip(), c, where) for c in REQUIRED_COLUMNS}
        arch = (row.get("arch") or "").strip() or "default"
        run_id = (row.get("run_id") or "").strip() or str(row_no)
        points.append(Point(arch=arch, run_id=run_id, **vals))
    if not points:
        raise UserError(f"fit: {path} has a header but no rows")
    return points
