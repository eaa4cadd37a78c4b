"""The `exported-mini/` fixture beside the e2e tests (a two-run study of the mini recipe, exported) and
what the tests that craft copies of it share: the copy, every file's bytes, a rewrite of the study
metadata, the one-line refusal (pytest puts tests/ on the path, pyproject's `pythonpath`)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

FIXTURE = Path(__file__).resolve().parent / "e2e" / "exported-mini"
META_KEY = b"ablate.study"


def copy_export(tmp_path: Path) -> Path:
    """The fixture's recipe and report folder under tmp_path; returns the report folder."""
    shutil.copy(FIXTURE / "mini.yaml", tmp_path)
    shutil.copytree(FIXTURE / "reports", tmp_path / "reports")
    return tmp_path / "reports" / "mini"


def files_under(root: Path) -> dict[str, bytes]:
    """Every file below `root`, by its path relative to it: its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def edit_meta(folder: Path, edit) -> None:
    """Rewrite runs.parquet with its study metadata changed by `edit(meta)` (as a crafted export would)."""
    table = pq.read_table(folder / "runs.parquet")
    meta = json.loads(table.schema.metadata[META_KEY])
    edit(meta)
    schema = table.schema.with_metadata({**table.schema.metadata, META_KEY: json.dumps(meta).encode()})
    pq.write_table(table.cast(schema), folder / "runs.parquet")


def edit_runs(folder: Path, edit) -> None:
    """Rewrite runs.parquet with its rows (each run's columns: JSON text) changed by `edit(rows)`, its
    study kept."""
    table = pq.read_table(folder / "runs.parquet")
    rows = table.to_pylist()
    edit(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), folder / "runs.parquet")


def edit_column(rows: list[dict], column: str, key: str, value) -> None:
    """Set `key` to `value` in the JSON column `column` (tags, params, metrics, artifacts) of every row."""
    for row in rows:
        row[column] = json.dumps({**json.loads(row[column]), key: value})


def one_line(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    """The command refused in one line with exit 2, no traceback, naming every fragment."""
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, proc.stderr
    assert all(f in err for f in fragments), err
