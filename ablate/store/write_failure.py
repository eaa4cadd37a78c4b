"""A write the tracking store could not make (a full disk, a file-size limit, an I/O error under SQLite) as
the one line a user acts on, not the traceback MLflow wraps it in.

MLflow's SQL store turns SQLite's `disk I/O error` or `database or disk is full` into an `MlflowException`
(through SQLAlchemy's `OperationalError`), raised wherever a verb writes a run's metrics, tags or status; the
CLI asks `store_write_failure` once, for any exception it did not expect, so this decision is made in one
place whatever the verb and wherever in it the write came.
"""

from __future__ import annotations

import errno

from ablate.core.errors import UserError

# SQLite's result codes for a write the disk refused (https://www.sqlite.org/rescode.html); EFBIG (a file
# size limit) reaches a Python process as SQLITE_IOERR_WRITE, since Python ignores SIGXFSZ.
_SQLITE_CODES = ("SQLITE_FULL", "SQLITE_IOERR")
_SQLITE_WORDS = ("disk I/O error", "database or disk is full")
_OS_CODES = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)


def store_write_failure(error: BaseException) -> UserError | None:
    """The one line for `error` when a write of the tracking store failed on its disk, else None."""
    for cause in _chain(error):
        name = getattr(cause, "sqlite_errorname", "") or ""
        text = (str(cause).splitlines() or [""])[0]
        if cause.__class__.__module__ == "sqlite3" or name:
            if name.startswith(_SQLITE_CODES) or any(words in text for words in _SQLITE_WORDS):
                return _line(error, f"{name or 'sqlite'}: {text[:120]}")
        if (
            isinstance(cause, OSError)
            and cause.errno in _OS_CODES
            and _through(error, ("mlflow", "sqlalchemy"))
        ):
            return _line(error, str(cause.strerror))
    return None


def _line(error: BaseException, why: str) -> UserError:
    """The line, naming the store the write was for: MLflow's (--tracking-uri) or the study's (--storage)."""
    flag, store = (
        ("--tracking-uri", "the MLflow store")
        if _through(error, ("mlflow",)) or not _through(error, ("optuna",))
        else ("--storage", "the Optuna study's store")
    )
    return UserError(
        f"{flag}: {store} could not be written ({why}); free some space or raise the file-size limit "
        "(ulimit -f) and run the command again: a run resumes from its last whole checkpoint"
    )


def _chain(error: BaseException) -> list[BaseException]:
    """`error`, its causes and contexts, and SQLAlchemy's wrapped driver error (`.orig`), each once."""
    seen: list[BaseException] = []
    todo = [error]
    while todo:
        e = todo.pop()
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [e.__cause__, e.__context__, getattr(e, "orig", None)]
    return seen


def _through(error: BaseException, packages: tuple[str, ...]) -> bool:
    """Whether `error` or one of its causes was raised by `packages` (their exception types or frames)."""
    for e in _chain(error):
        if type(e).__module__.startswith(packages):
            return True
        tb = e.__traceback__
        while tb is not None:
            if tb.tb_frame.f_globals.get("__name__", "").startswith(packages):
                return True
            tb = tb.tb_next
    return False
