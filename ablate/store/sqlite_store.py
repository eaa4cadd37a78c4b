"""An MLflow SQLite store looked at before MLflow opens it.

Why not leave it to MLflow: opening a store from an older MLflow, MLflow migrates it in place with no copy
(its tables are created and its schema upgraded as it opens), so a user who goes back to the older MLflow
has lost the store; a store from a newer MLflow, or a file that is not a database, ends in a traceback.
Here a store from an older MLflow is copied first, beside it as `mlflow.db.bak-<schema revision>`, then
migrated, said in a line; the others are one line each that names the file and what to do.

The schema revision is alembic's, as MLflow records it (`alembic_version`); the head revision and the
migration are MLflow's own (`mlflow.store.db.utils`, the code `mlflow db upgrade` runs).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
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
    """Look at the SQLite store `uri` names (other URIs: nothing to do): a missing or empty file, or one at
    this MLflow's schema, passes; one from an older MLflow is copied, then migrated; else one line."""
    if not uri.startswith("sqlite:///"):
        return
    decode_mlflow_parent_dirs()
    path = sqlite_path(uri).resolve()
    if path in _CHECKED or not path.is_file() or path.stat().st_size == 0:
        return
    with _exclusive(path):  # workers starting together: one copies and migrates, the others find it done
        version = schema_version(path)
        head = head_revision()
        if version is not None and version != head:
            if not known_revision(version):
                import mlflow

                raise UserError(
                    f"--tracking-uri: {path} was written by a newer MLflow (schema {version}; MLflow "
                    f"{mlflow.__version__} here knows schemas up to {head}); install the MLflow that wrote "
                    "it (pip install -U mlflow) or use another workspace"
                )
            if _never_used(path):  # a creation killed between two migrations: finish it, nothing to keep
                _migrate(path)
            else:
                _copy_then_migrate(path, version, head)
    _CHECKED.add(path)


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


def _never_used(path: Path) -> bool:
    """No experiment at all, not even MLflow's Default (made once its migrations end, and kept, as
    `deleted`, when a user deletes it): the store's first creation was killed before it finished, so it is
    no older MLflow's store and holds nothing to keep a copy of."""
    with contextlib.closing(sqlite3.connect(_file_uri(path, "ro"), uri=True)) as db:
        try:
            return db.execute("SELECT count(*) FROM experiments").fetchone()[0] == 0
        except sqlite3.OperationalError:  # no experiments table yet
            return True


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
def _exclusive(path: Path):
    """An exclusive flock on the store file (SQLite's own locks are fcntl locks: they do not meet)."""
    with open(path, "rb") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield
