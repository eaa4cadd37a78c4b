"""An MLflow SQLite store looked at before MLflow opens it.

Why not leave it to MLflow: opening a store from an older MLflow, MLflow migrates it in place with no copy
(its tables are created and its schema upgraded as it opens), so a user who goes back to the older MLflow
has lost the store; a store from a newer MLflow, or a file that is not a database, ends in a traceback.
Here a store from an older MLflow is copied first, beside it as `mlflow.db.bak-<schema revision>`, then
migrated, said in a line; the others are one line each that names the file and what to do.

The schema revision is alembic's, as MLflow records it (`alembic_version`); the head revision and the
migration are MLflow's own (`mlflow.store.db.utils`, the code `mlflow db upgrade` runs).

A store is created once, whole, or not at all. MLflow creates a missing store in place, table by table and
migration by migration, with no lock between processes: two first commands at once, a kill, a full disk or
a file-size limit mid-way leave a store that every later open fails on. Here it is made under an exclusive
lock on its folder, in a hidden file beside it (`.mlflow.db.creating-<pid>`) by MLflow's own store class,
and renamed into place once whole (its migrations at the head and MLflow's Default experiment in it). A
store that an earlier version left half-made (no experiment, no run: its creation was stopped before the
Default experiment, which MLflow makes last) is set aside as `mlflow.db.half-made-<n>`, said in one line,
and made again; a store that holds an experiment or a run is never set aside.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import sqlite3
from pathlib import Path

from ablate.core.errors import UserError

_CHECKED: set[Path] = set()  # stores found at this MLflow's schema: looked at once per process


def sqlite_url(path: Path) -> str:
    """The SQLAlchemy URL of the SQLite file `path`, its characters quoted: SQLAlchemy ends the path at a
    `?` (the URL's query) and decodes `%XX`, so an unquoted `ws?q=1` or `a%20b` would name another file."""
    import urllib.parse

    return "sqlite:///" + urllib.parse.quote(str(path), safe="/")


def decode_mlflow_parent_dirs() -> None:
    """MLflow (3.x, `mlflow.store.db.utils._make_parent_dirs_if_sqlite`) creates the parent folder of a
    SQLite URL's text without decoding it, so a quoted workspace `ws?q=1` would also leave an empty
    `ws%3Fq%3D1` beside it; this makes it create the folder the URL names, as SQLAlchemy reads it. Nothing
    happens where MLflow has no such function."""
    from mlflow.store.db import utils

    made = getattr(utils, "_make_parent_dirs_if_sqlite", None)
    if made is None or getattr(made, "decodes_the_path", False):
        return

    def make_parent_dirs(db_uri: str) -> None:
        if db_uri.startswith("sqlite:///") and db_uri.removeprefix("sqlite:///") not in ("", ":memory:"):
            sqlite_path(db_uri).parent.mkdir(parents=True, exist_ok=True)

    make_parent_dirs.decodes_the_path = True  # type: ignore[attr-defined]
    utils._make_parent_dirs_if_sqlite = make_parent_dirs


def sqlite_path(uri: str) -> Path:
    """The file a `sqlite:///` URL names, read the way SQLAlchemy reads it (the query cut, `%XX` decoded)."""
    import urllib.parse

    return Path(urllib.parse.unquote(uri[len("sqlite:///") :].split("?", 1)[0]))


def check(uri: str) -> None:
    """Make the SQLite store `uri` names whole before MLflow opens it (other URIs: nothing to do): a store at
    this MLflow's schema passes unlocked; a missing or empty one is created whole; a half-made one is set
    aside and made again; one from an older MLflow is copied, then migrated; else one line."""
    if not uri.startswith("sqlite:///"):
        return
    decode_mlflow_parent_dirs()
    path = sqlite_path(uri).resolve()
    if path in _CHECKED or _whole(path):
        _CHECKED.add(path)
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # as MLflow does for a store's folder
    except OSError as e:
        raise UserError(f"--tracking-uri: cannot make the folder of {path}: {e.strerror or e}") from None
    with _exclusive(path.parent):  # first commands at once: one makes the store, the others find it made
        _make_whole(path)
    _CHECKED.add(path)


def _whole(path: Path) -> bool:
    """Whether `path` is a store at this MLflow's schema holding its Default experiment (read-only: the
    common case takes no lock and writes nothing, so a read-only workspace is read)."""
    try:
        if not path.is_file() or path.stat().st_size == 0:
            return False
        with contextlib.closing(sqlite3.connect(_file_uri(path, "ro"), uri=True)) as db:
            row = db.execute("SELECT version_num FROM alembic_version").fetchone()
            made = db.execute("SELECT count(*) FROM experiments").fetchone()[0] > 0
    except (OSError, sqlite3.Error):
        return False
    return made and row is not None and row[0] == head_revision()


def _make_whole(path: Path) -> None:
    """Under the folder's lock: create, set aside and make again, or migrate the store at `path`."""
    _discard_creations(path)
    if path.is_file() and path.stat().st_size > 0:
        if _half_made(path):
            aside = _set_aside(path)
            print(
                f"[mlflow] {path} was left half-made by an interrupted creation and holds no run; kept it "
                f"as {aside.name} and made the store again",
                flush=True,
            )
        else:
            version = schema_version(path)
            head = head_revision()
            if version is not None and version != head:
                if not known_revision(version):
                    import mlflow

                    raise UserError(
                        f"--tracking-uri: {path} was written by a newer MLflow (schema {version}; MLflow "
                        f"{mlflow.__version__} here knows schemas up to {head}); install the MLflow that "
                        "wrote it (pip install -U mlflow) or use another workspace"
                    )
                _copy_then_migrate(path, version, head)
            return
    if not path.is_file() or path.stat().st_size == 0:
        _create(path)


def schema_version(path: Path) -> str | None:
    """The store's schema revision; None for a database with no tables yet (MLflow creates them). A file
    that is not an SQLite database, or a database that is not MLflow's, is one line."""
    damaged = (
        f"restore it from a backup, or move it aside (mv {path} {path}.damaged) to start an empty store "
        "(the runs' checkpoints and results in the workspace's runs/ folder stay)"
    )
    try:
        try:
            return _read_version(path, "ro", damaged)
        except sqlite3.OperationalError as e:
            if getattr(e, "sqlite_errorname", "") != "SQLITE_READONLY_ROLLBACK":
                raise
            # A writer was killed inside a transaction (a sweep's SIGKILL): its hot journal must be rolled
            # back before the file can be read, which SQLite does on the first read-write open.
            return _read_version(path, "rw", damaged)
    except sqlite3.DatabaseError as e:
        raise UserError(f"--tracking-uri: {path} is not an SQLite database ({e}); {damaged}") from None


def _read_version(path: Path, mode: str, damaged: str) -> str | None:
    with contextlib.closing(sqlite3.connect(_file_uri(path, mode), uri=True)) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            return None
        if "alembic_version" not in tables:
            raise UserError(f"--tracking-uri: {path} is an SQLite database but not MLflow's; {damaged}")
        row = db.execute("SELECT version_num FROM alembic_version").fetchone()
    return row[0] if row else None


@functools.cache
def _script() -> object:
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    return ScriptDirectory.from_config(_get_alembic_config("sqlite://"))


def head_revision() -> str:
    return _script().get_current_head()


def known_revision(version: str) -> bool:
    """Whether this MLflow's migrations know `version` (an older schema), not only a newer MLflow's."""
    from alembic.util import CommandError

    try:
        return _script().get_revision(version) is not None
    except CommandError:
        return False


def _file_uri(path: Path, mode: str) -> str:
    """SQLite's URI of `path` opened in `mode`, the path quoted (a `?` or `#` in it is no query)."""
    import urllib.parse

    return f"file:{urllib.parse.quote(str(path), safe='/')}?mode={mode}"


def _half_made(path: Path) -> bool:
    """An SQLite database with no table, or with MLflow's `experiments` table empty and no run: a first
    creation stopped before MLflow made its Default experiment (made once its migrations end, and kept, as
    `deleted`, when a user deletes it), so no store of any MLflow that holds anything to keep in place."""
    try:
        with _read(path) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not tables:
                return True
            if "experiments" not in tables:
                return False
            runs = db.execute("SELECT count(*) FROM runs").fetchone()[0] if "runs" in tables else 0
            return runs == 0 and db.execute("SELECT count(*) FROM experiments").fetchone()[0] == 0
    except sqlite3.DatabaseError:  # not a database: schema_version says so in its line
        return False


@contextlib.contextmanager
def _read(path: Path):
    """`path` opened to read; read-write where a writer killed inside a transaction left a hot journal,
    which SQLite rolls back on the first read-write open and a read-only one cannot."""
    db = sqlite3.connect(_file_uri(path, "ro"), uri=True)
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as e:
        db.close()
        if getattr(e, "sqlite_errorname", "") != "SQLITE_READONLY_ROLLBACK":
            raise
        db = sqlite3.connect(_file_uri(path, "rw"), uri=True)
    with contextlib.closing(db):
        yield db


def _set_aside(path: Path) -> Path:
    """`path` renamed to the first free `<name>.half-made-<n>` (under the folder's lock: no one else
    renames), so a half-made store is kept for whoever wants to look at it."""
    n = 1
    while (aside := path.with_name(f"{path.name}.half-made-{n}")).exists():
        n += 1
    path.rename(aside)
    return aside


def _creations(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f".{path.name}.creating-*"))


def _discard_creations(path: Path) -> None:
    """The files of creations that were stopped (a kill, a full disk): under the lock none is in progress,
    and none was ever the store, so nothing in them is kept."""
    for leftover in _creations(path):
        leftover.unlink(missing_ok=True)


def _create(path: Path) -> None:
    """The store made whole by MLflow's own store class (its tables, every migration, the Default
    experiment) in a hidden file beside `path`, then renamed into place; a write that fails (a full disk, a
    file-size limit) leaves nothing behind and is one line."""
    import logging

    import sqlalchemy
    from mlflow.exceptions import MlflowException
    from mlflow.store.tracking import DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    for name in ("alembic", "mlflow.store.db.utils"):  # the migrations' chatter says nothing a user needs
        logging.getLogger(name).setLevel(logging.CRITICAL)
    making = path.with_name(f".{path.name}.creating-{os.getpid()}")
    url = sqlite_url(making)
    try:
        try:
            # The artifact root MLflow gives a store it creates itself (its Default experiment's location).
            SqlAlchemyStore(url, DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH)
        finally:
            engine = SqlAlchemyStore._engine_map.pop(url, None)
            if engine is not None:
                engine.dispose()
        _sync(making)
        os.replace(making, path)
        _sync(path.parent)
    except (OSError, sqlite3.Error, sqlalchemy.exc.SQLAlchemyError, MlflowException) as e:
        _discard_creations(path)
        raise UserError(
            f"--tracking-uri: could not create the MLflow store {path} ({_why(e)}); it needs about 1 MB in a "
            "writable folder: free some space, raise the file-size limit (ulimit -f) or give another "
            "--workspace, and run again (nothing was left in its place)"
        ) from None


def _why(error: BaseException) -> str:
    """The first line of the innermost cause (sqlite's own words: `disk I/O error`, `database or disk is
    full`), not the wrappers' text around it."""
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__
    text = getattr(error, "strerror", None) or (str(error).splitlines() or [""])[0]
    return f"{type(error).__name__}: {text[:160]}"


def _sync(path: Path) -> None:
    """The file or folder `path` written to the disk, so a rename never lands before its contents."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_then_migrate(path: Path, version: str, head: str) -> None:
    import mlflow

    backup = path.with_name(f"{path.name}.bak-{version}")
    if not backup.exists():  # an earlier attempt's copy is the older MLflow's store: kept as it is
        import shutil

        partial = backup.with_name(backup.name + ".partial")
        shutil.copy2(path, partial)  # byte for byte: the older MLflow opens it as it was
        partial.replace(backup)
    print(
        f"[mlflow] {path} is a store of an older MLflow (schema {version}); kept a copy as {backup.name}, "
        f"migrating it to MLflow {mlflow.__version__}'s schema {head}",
        flush=True,
    )
    _migrate(path)


def _migrate(path: Path) -> None:
    """MLflow's own migration of the store to its schema (what `mlflow db upgrade` runs)."""
    import sqlalchemy
    from mlflow.store.db.utils import _upgrade_db

    engine = sqlalchemy.create_engine(sqlite_url(path))
    try:
        _upgrade_db(engine)
    finally:
        engine.dispose()


@contextlib.contextmanager
def _exclusive(folder: Path):
    """An exclusive flock on the store's folder: no lock file is left in it, and it is never the store file
    (SQLite's own locks are fcntl locks, which a flock does not meet, but a store renamed into place is
    another file than the one a waiting process opened). Where a folder cannot be locked (NFS emulates
    flock with fcntl locks, which need a file open for writing), a hidden `.mlflow.lock` file in it is."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise UserError(f"--tracking-uri: cannot open the folder {folder}: {e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        fd = _lock_file(folder)
    try:
        yield
    finally:
        os.close(fd)


def _lock_file(folder: Path) -> int:
    """The descriptor of `folder`'s `.mlflow.lock`, locked exclusively."""
    fd = -1
    try:
        fd = os.open(folder / ".mlflow.lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd
    except OSError as e:
        if fd >= 0:
            os.close(fd)
        raise UserError(f"--tracking-uri: cannot lock the folder {folder}: {e.strerror or e}") from None
