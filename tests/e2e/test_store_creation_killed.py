"""A workspace's MLflow store is created once, whole, or not at all (ablate.store.sqlite_store): a process
killed at any point of the creation leaves no store, or a whole one, and the next command makes or uses it;
a store an earlier version left half-made is set aside (kept, named in one line) and made again; a store
that holds runs is never set aside. Real processes killed with SIGKILL, real SQLite stores under tmp_path;
the next open is the real `Stores.client()`, as every verb's first step."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ablate.store import sqlite_store, tracking
from ablate.store.stores import Stores

# A process that creates the workspace's store through `Stores.client()` and kills itself (SIGKILL) at one
# point of the creation, each point a function the creation calls, replaced to die there.
KILLED_AT = """
    import os, signal, sys
    import mlflow.store.db.utils as utils
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from ablate.store import sqlite_store
    from ablate.store.stores import Stores

    workspace, point, middle = sys.argv[1], sys.argv[2], sys.argv[3]

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    def half_the_migrations(engine):  # MLflow's migrations run up to a middle revision, then the kill
        from alembic import command
        config = utils._get_alembic_config(str(engine.url))
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, middle)
        die()

    if point == "tables":  # MLflow's first tables made, no migration yet
        utils._upgrade_db = die
    elif point == "migrations":
        utils._upgrade_db = half_the_migrations
    elif point == "default":  # every migration done, MLflow's Default experiment not made yet
        SqlAlchemyStore._initialize_store_state = die
    elif point == "rename":  # the store whole beside its place, not renamed into it yet
        sqlite_store._sync = die
    Stores(workspace).client()
    print("not killed", flush=True)
"""

POINTS = ["tables", "migrations", "default", "rename"]


def _middle_revision() -> str:
    revisions = [r.revision for r in sqlite_store._script().walk_revisions()]  # newest first
    return revisions[len(revisions) // 2]


def _next_command_works(workspace: Path) -> None:
    """What every verb does first: the store opened, an experiment made in it and a run recorded."""
    sqlite_store._CHECKED.clear()
    client = Stores(workspace).client()
    experiment = tracking.get_experiment_id(client, "after", Stores(workspace).workspace)
    run = client.create_run(experiment, run_name="r")
    client.log_metric(run.info.run_id, "loss", 1.0)
    assert {e.name for e in client.search_experiments()} == {"Default", "after"}
    db = workspace / "mlflow.db"
    assert sqlite_store.schema_version(db) == sqlite_store.head_revision()


@pytest.mark.parametrize("point", POINTS)
def test_a_creation_killed_at_each_point_leaves_no_store_and_the_next_command_makes_it(tmp_path, point):
    workspace = tmp_path / "ws?q=1 #x"  # the path's characters too: the store is read through SQLite URIs
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(KILLED_AT), str(workspace), point, _middle_revision()],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr[-2000:]
    assert not (workspace / "mlflow.db").exists()  # killed before the rename: no store, not a half-made one
    assert [p.name for p in workspace.glob(".mlflow.db.creating-*")]  # the killed creation's file
    _next_command_works(workspace)
    assert sorted(p.name for p in workspace.iterdir()) == ["mlflow.db"]  # the leftover gone, nothing else
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ws?q=1 #x"]  # nothing outside the workspace


def test_a_creation_killed_at_moments_of_a_real_command_leaves_a_usable_workspace(tmp_path):
    """The same with no function replaced: a process opening a new workspace's store is killed 0 and 0.5 s
    after its creation file appears (wherever in the creation that lands)."""
    script = "import sys; from ablate.store.stores import Stores; Stores(sys.argv[1]).client()"
    for i, delay in enumerate([0.0, 0.5]):
        workspace = tmp_path / f"ws{i}"
        proc = subprocess.Popen([sys.executable, "-c", script, str(workspace)])
        deadline = time.monotonic() + 300
        while not list(workspace.glob(".mlflow.db.creating-*")) and proc.poll() is None:
            assert time.monotonic() < deadline, "the store's creation never started"
            time.sleep(0.01)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        db = workspace / "mlflow.db"
        assert not db.exists() or sqlite_store._whole(db)  # no store, or a whole one: never half of one
        _next_command_works(workspace)


def _left_half_made(db: Path, revision: str | None) -> None:
    """`db` as an earlier version of ablate left it when MLflow's creation in place was killed: MLflow's
    first tables, then its migrations up to `revision` (None: none), and no Default experiment."""
    import sqlalchemy
    from alembic import command
    from mlflow.store.db.utils import _get_alembic_config
    from mlflow.store.tracking.dbmodels.initial_models import Base

    url = sqlite_store.sqlite_url(db)
    engine = sqlalchemy.create_engine(url)
    try:
        Base.metadata.create_all(engine)
        if revision is not None:
            config = _get_alembic_config(url)
            with engine.begin() as connection:
                config.attributes["connection"] = connection
                command.upgrade(config, revision)
    finally:
        engine.dispose()


@pytest.mark.parametrize("where", ["none", "middle", "head"])
def test_a_store_left_half_made_in_place_is_set_aside_and_made_again(tmp_path, capsys, where):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    db = workspace / "mlflow.db"
    _left_half_made(
        db, {"none": None, "middle": _middle_revision(), "head": sqlite_store.head_revision()}[where]
    )
    half = db.read_bytes()
    capsys.readouterr()
    sqlite_store._CHECKED.clear()
    Stores(workspace).client()
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if "half-made" in line]
    assert f"{db} was left half-made" in line and "kept it as mlflow.db.half-made-1" in line, out
    assert "older MLflow" not in out, out
    assert (workspace / "mlflow.db.half-made-1").read_bytes() == half  # kept as it was
    _next_command_works(workspace)
    assert sorted(p.name for p in workspace.iterdir()) == ["mlflow.db", "mlflow.db.half-made-1"]


def test_a_store_that_holds_a_run_is_never_set_aside(tmp_path, capsys):
    """Its Default experiment deleted for good and a run left (so it looks like no creation finished, but
    it holds something): it is not set aside nor touched; MLflow opens it as it is."""
    workspace = tmp_path / "ws"
    client = Stores(workspace).client()
    experiment = client.create_experiment("kept", artifact_location=(workspace / "artifacts").as_uri())
    client.create_run(experiment, run_name="r")
    db = workspace / "mlflow.db"
    with sqlite3.connect(db) as con:  # the experiments emptied by hand, the run kept
        con.execute("PRAGMA foreign_keys = OFF")
        con.execute("DELETE FROM experiments")
    before = db.read_bytes()
    sqlite_store._CHECKED.clear()
    capsys.readouterr()
    Stores(workspace).client()
    assert "half-made" not in capsys.readouterr().out
    assert db.read_bytes() == before and sorted(p.name for p in workspace.iterdir()) == ["mlflow.db"]


def test_no_creation_file_is_left_by_one_that_finished(tmp_path):
    workspace = tmp_path / "ws"
    Stores(workspace).client()
    assert sorted(p.name for p in workspace.iterdir()) == ["mlflow.db"]
    assert not any(name.startswith(".") for name in os.listdir(workspace))


def test_a_folder_that_cannot_be_locked_is_locked_through_a_file_in_it(tmp_path, monkeypatch):
    """NFS refuses a flock on a folder opened to read (its flock is an fcntl lock, which needs a file open
    for writing): the creation locks a hidden `.mlflow.lock` file in the folder instead."""
    import errno
    import fcntl
    import stat

    real = fcntl.flock

    def nfs_like(fd, operation):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        return real(fd, operation)

    monkeypatch.setattr(sqlite_store.fcntl, "flock", nfs_like)
    workspace = tmp_path / "ws"
    _next_command_works(workspace)
    names = set(os.listdir(workspace))
    assert {".mlflow.lock", "mlflow.db"} <= names and not any(".creating-" in name for name in names)
