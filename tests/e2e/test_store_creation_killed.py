"""A store whose first creation was killed (SIGKILL between two of MLflow's migrations) is finished on the
next open: not taken for an older MLflow's store, no `.bak` copy beside it, nothing said about versions
(ablate.store.sqlite_store). A real process creates the store the way MLflow does and kills itself
mid-way; the next open is the real `Stores.client()`."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from ablate.store import sqlite_store
from ablate.store.stores import Stores

CREATE_THEN_DIE = """
    import os, signal, sys
    import sqlalchemy
    from alembic import command
    from mlflow.store.db.utils import _get_alembic_config
    from mlflow.store.tracking.dbmodels.initial_models import Base

    url, revision = sys.argv[1], sys.argv[2]
    engine = sqlalchemy.create_engine(url)
    Base.metadata.create_all(engine)  # MLflow's first step, then its migrations one by one
    config = _get_alembic_config(url)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
    os.kill(os.getpid(), signal.SIGKILL)  # killed before the last migration and the Default experiment
"""


def test_a_store_whose_creation_was_killed_is_finished_not_backed_up(tmp_path, capsys):
    workspace = tmp_path / "ws?q=1 #x"  # the path's characters too: the store is read through SQLite URIs
    workspace.mkdir()
    db = workspace / "mlflow.db"
    revisions = [r.revision for r in sqlite_store._script().walk_revisions()]  # newest first
    middle = revisions[len(revisions) // 2]
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CREATE_THEN_DIE), sqlite_store.sqlite_url(db), middle],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert sqlite_store.schema_version(db) == middle  # what the kill left
    capsys.readouterr()
    client = Stores(workspace).client()
    out = capsys.readouterr().out
    assert "older MLflow" not in out and "kept a copy" not in out, out
    assert sorted(p.name for p in workspace.iterdir()) == ["mlflow.db"]  # no .bak copy
    assert sqlite_store.schema_version(db) == sqlite_store.head_revision()
    assert [e.name for e in client.search_experiments()] == ["Default"]  # created as a fresh store is
