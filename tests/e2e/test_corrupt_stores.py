"""Damaged or foreign stores end in one line that names the file and what to do, and nothing earlier is lost:
garbage in the Optuna journal, an `mlflow.db` that is not a database or from another MLflow (an older one
is copied beside it, then migrated), a folder as --tracking-uri, a disk that fills while a checkpoint is
written (a small tmpfs). Real stores of a workspace under tmp_path; the CLI in this process."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
from mini_project import one_line_refusal, write_recipe

from ablate.cli import main
from ablate.store import sqlite_store
from ablate.store.stores import Stores


def test_garbage_in_the_optuna_journal_is_one_line_naming_it(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    workspace = tmp_path / "ws"
    study = __import__("optuna").create_study(study_name="mini", storage=Stores(workspace).storage())
    study.enqueue_trial({}, user_attrs={"plan": "{}"})
    journal = workspace / "optuna.journal"
    good = journal.read_bytes()
    damaged = good[:60] + b"\x00\x13garbage\n" + good[60:]  # a line in the middle, not a torn last one
    journal.write_bytes(damaged)
    capsys.readouterr()
    code = main(["status", str(recipe), "--workspace", str(workspace)])
    one_line_refusal(capsys, code, f"--storage: {journal} is not a readable Optuna journal", "move it aside")
    assert journal.read_bytes() == damaged  # left as it was, for the user to move


def _train(recipe: Path, workspace: Path, *extra: str) -> int:
    return main(["train", str(recipe), "--variant", "transformer", "--workspace", str(workspace), *extra])


def test_an_mlflow_db_that_is_not_a_database_is_one_line(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    db = workspace / "mlflow.db"
    db.write_bytes(b"these are notes, not a database\n" * 100)
    one_line_refusal(capsys, _train(recipe, workspace), f"{db} is not an SQLite database", "move it aside")
    assert db.read_bytes() == b"these are notes, not a database\n" * 100


def _store_at(path: Path, revision: str) -> None:
    """An MLflow SQLite store as MLflow's migrations leave it at `revision` (an older MLflow's store)."""
    import sqlalchemy
    from alembic import command
    from mlflow.store.db.utils import _get_alembic_config
    from mlflow.store.tracking.dbmodels.initial_models import Base

    url = f"sqlite:///{path}"
    engine = sqlalchemy.create_engine(url)
    Base.metadata.create_all(engine)
    config = _get_alembic_config(url)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
    engine.dispose()


def test_an_older_mlflow_store_is_copied_beside_it_before_it_is_migrated(tmp_path, capsys):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    db = workspace / "mlflow.db"
    revisions = [r.revision for r in sqlite_store._script().walk_revisions()]  # newest first
    old = revisions[len(revisions) // 2]
    _store_at(db, old)
    with contextlib.closing(sqlite3.connect(db)) as con:
        con.execute("INSERT INTO experiments (name, lifecycle_stage) VALUES ('kept', 'active')")
        con.commit()
    before = db.read_bytes()
    capsys.readouterr()
    client = Stores(workspace).client()
    out = capsys.readouterr().out
    assert f"kept a copy as mlflow.db.bak-{old}" in out and "migrating" in out
    assert (workspace / f"mlflow.db.bak-{old}").read_bytes() == before  # the older MLflow's store, whole
    assert sqlite_store.schema_version(db) == sqlite_store.head_revision()
    assert "kept" in [e.name for e in client.search_experiments()]  # migrated with what it held


def test_a_newer_mlflow_store_is_one_line_and_left_alone(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    db = workspace / "mlflow.db"
    Stores(workspace).client().search_experiments()  # a store at this MLflow's schema
    with contextlib.closing(sqlite3.connect(db)) as con:
        con.execute("UPDATE alembic_version SET version_num = 'f0f0f0f0f0f0'")  # as a newer MLflow leaves it
        con.commit()
    before = db.read_bytes()
    sqlite_store._CHECKED.clear()
    code = _train(recipe, workspace)
    one_line_refusal(capsys, code, f"{db} was written by a newer MLflow (schema f0f0f0f0f0f0")
    assert db.read_bytes() == before and sorted(p.name for p in workspace.iterdir()) == ["mlflow.db"]


def test_a_store_whose_writer_was_killed_mid_transaction_opens(tmp_path, capsys):
    """A sweep killed (SIGKILL) while MLflow wrote leaves a hot journal beside mlflow.db, which a read-only
    open cannot roll back: the store is SQLite's to recover, not damaged, and the next command uses it."""
    import signal
    import sys
    import textwrap

    recipe = write_recipe(tmp_path)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    db = workspace / "mlflow.db"
    Stores(workspace).client().search_experiments()  # a store at this MLflow's schema
    writer = textwrap.dedent(f"""
        import sqlite3, time
        db = sqlite3.connect({str(db)!r}, isolation_level=None)
        db.execute("PRAGMA cache_size = 1")  # pages spill into the file before the commit
        db.execute("CREATE TABLE IF NOT EXISTS scratch (x BLOB)")
        db.execute("BEGIN")
        for _ in range(300):
            db.execute("INSERT INTO scratch VALUES (randomblob(4096))")
        print("inside", flush=True)
        time.sleep(600)
    """)
    child = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "inside"
    child.send_signal(signal.SIGKILL)
    child.wait()
    with pytest.raises(sqlite3.OperationalError, match="readonly"):  # what the store's check met before
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            con.execute("SELECT name FROM sqlite_master").fetchall()
    sqlite_store._CHECKED.clear()
    assert sqlite_store.schema_version(db) == sqlite_store.head_revision()
    assert not Path(f"{db}-journal").exists() or Path(f"{db}-journal").stat().st_size == 0
    capsys.readouterr()
    assert _train(recipe, workspace) == 0, capsys.readouterr().err


@pytest.mark.parametrize("form", ["folder", "file://"])
def test_a_folder_as_tracking_uri_is_one_line(tmp_path, capsys, form):
    recipe = write_recipe(tmp_path)
    folder = tmp_path / "mlruns"
    uri = str(folder) if form == "folder" else folder.as_uri()
    code = _train(recipe, tmp_path / "ws", "--tracking-uri", uri)
    one_line_refusal(
        capsys, code, "--tracking-uri", "MLflow 3 does not open", f"sqlite:///{folder}/mlflow.db"
    )
    assert not (tmp_path / "ws").exists() and not folder.exists()


@contextlib.contextmanager
def _small_filesystem(where: Path, size: str):
    """A tmpfs of `size` mounted at `where` (root only; skipped elsewhere)."""
    where.mkdir(parents=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=False)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def test_a_disk_full_while_a_checkpoint_is_saved_is_one_line(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    workspace = tmp_path / "ws"
    with _small_filesystem(workspace / "runs", "128k"):  # less than one checkpoint of the mini model
        code = _train(recipe, workspace)
        one_line_refusal(
            capsys, code, "checkpoint: the disk holding", "is full", "resumes from its last whole"
        )
    assert (workspace / "mlflow.db").exists()  # the store beside it is untouched by the full disk
