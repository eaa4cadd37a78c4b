"""Where a study's records live: the workspace folder (checkpoints, caches, embedded stores), the MLflow
tracking URI and the Optuna storage URL; None = the workspace's embedded store.

- MLflow: SQLite at `<workspace>/mlflow.db` by default; `http://host:5000` (`ablate server`), a
  database URL, or `export:FOLDER` (a report folder's runs, read-only: ablate.store.export).
- Optuna: the journal file `<workspace>/optuna.journal` by default; `journal:PATH` (a shared filesystem
  for workers on several nodes), or a database URL.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ablate.core.errors import UserError
from ablate.core.workspace import Workspace
from ablate.store import tracking


@dataclass(frozen=True)
class Stores:
    workspace: Workspace
    tracking_uri: str | None = None
    storage_url: str | None = None
    read_only: bool = (
        False  # a verb that only reads (status; report on a read-only workspace): an existing workspace is
        # not probed for writing, and nothing is recorded into its stores
    )

    def __post_init__(self) -> None:
        if not isinstance(self.workspace, Workspace):  # a --workspace path, as the verbs and tests give it
            object.__setattr__(self, "workspace", Workspace(self.workspace))

    @property
    def from_export(self) -> bool:
        """Whether the tracking URI names a report folder's export (ablate.store.export), read-only."""
        from ablate.store import export

        return bool(self.tracking_uri) and self.tracking_uri.startswith(export.SCHEME)

    @property
    def writes_records(self) -> bool:
        """Whether a verb may record into the tracking store (tags, the UI's series, a report's copy): not
        into an export, nor into a workspace a verb only reads."""
        return not self.from_export and not self.read_only

    @property
    def export_folder(self) -> Path:
        """The report folder an `export:FOLDER` tracking URI names."""
        from ablate.store import export

        return Path(self.tracking_uri[len(export.SCHEME) :])

    def mlflow_uri(self) -> str:
        """The tracking URI MLflow opens: the given one, or the workspace's SQLite file."""
        from ablate.store import sqlite_store

        if self.tracking_uri:
            uri = tracking.database_url(self.tracking_uri)
        else:
            uri = sqlite_store.sqlite_url(self._workspace().mlflow_db)  # quoted: a path stays a path
        sqlite_store.check(uri)  # an older MLflow's SQLite store is copied before it is migrated
        return uri

    def client(self) -> Any:
        """An `MlflowClient` of the tracking store (or, for an export, its runs read with no store)."""
        from ablate.store import export

        if self.from_export:
            return export.ExportedRuns(self.export_folder)
        import logging
        import os

        import mlflow

        # MLflow draws a progress bar per artifact it reads (a report reads one per run): noise in a log
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

        # The migration chatter on first use of a SQLite store says nothing a user needs, and MLflow logs
        # the traceback of a failed write (`mlflow.store.db.utils`) before raising it: the CLI says it in
        # one line (ablate.store.write_failure), and any other error keeps its own traceback.
        logging.getLogger("alembic").setLevel(logging.WARNING)
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
        return mlflow.MlflowClient(tracking_uri=self.mlflow_uri())

    def optuna_url(self) -> str:
        """The Optuna storage as a URL a worker is given: the given one, or the workspace's journal."""
        return self.storage_url or f"journal:{self._workspace().journal}"

    def _workspace(self) -> Workspace:
        """The workspace, made and checked writable (one line if not) unless it exists and is only read."""
        return self.workspace if self.read_only and self.workspace.root.is_dir() else self.workspace.create()

    def storage(self) -> Any:
        """The Optuna storage: a journal file (the workspace's by default) or an RDB."""
        import optuna
        from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

        url = self.optuna_url()
        if url.startswith("journal:"):
            path = Path(url[len("journal:") :])
            path.parent.mkdir(parents=True, exist_ok=True)
            # The O_EXCL lock file Optuna recommends on NFSv3+, so workers on several nodes of a shared
            # filesystem take turns (it excludes the default symlink lock too: both are `<path>.lock`).
            lock = JournalFileOpenLock(str(path))
            try:  # the journal is replayed here: a damaged line fails now, not in some later read
                return optuna.storages.JournalStorage(JournalFileBackend(str(path), lock_obj=lock))
            except (ValueError, TypeError, KeyError, AssertionError, AttributeError, IndexError) as e:
                raise UserError(
                    f"--storage: {path} is not a readable Optuna journal ({type(e).__name__}: "
                    f"{(str(e).splitlines() or [''])[0][:120]}); move it aside (mv {path} {path}.damaged) and "
                    "run the sweep again: its finished runs stay in MLflow and their run folders, and are not "
                    "trained again"
                ) from None
        if "://" not in url:
            raise UserError(
                f"--storage: {url!r} is not a URL; use postgresql://user@host/db, sqlite:///file.db "
                "or journal:/path/file"
            )
        try:
            return optuna.storages.RDBStorage(
                tracking.database_url(url), engine_kwargs={"pool_pre_ping": True}
            )
        except Exception as e:  # driver missing, server down, bad credentials: all the user's to fix
            raise UserError(
                f"--storage: cannot open {url}: {type(e).__name__}: {str(e).splitlines()[0]}"
            ) from None


def sweep_runs_url(
    stores: Stores, recipe: str, scale: str, ui_url: str = "http://127.0.0.1:5000"
) -> str | None:
    """The link that opens a sweep's runs as a comparison of its variants (ablate.store.comparison), its
    view saved first where the store is written to (`ablate ui` saves it too); None when the store has no
    such experiment yet."""
    from ablate.store import comparison

    client = stores.client()
    experiment = client.get_experiment_by_name(tracking.experiment_name(recipe, scale))
    if experiment is None:
        return None
    if stores.writes_records:
        comparison.save_view(client, experiment.experiment_id)
    return comparison.view_url(ui_url, experiment.experiment_id)


# A store URL with a password reaches a child process (a local worker) through these variables, never its
# argument list, which anyone on the machine reads (`ps`): `child_env` sets them, `passed_down` reads them.
STORAGE_ENV = "ABLATE_STORAGE"
TRACKING_ENV = "ABLATE_TRACKING_URI"


def child_env(stores: Stores, env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """(`--storage`/`--tracking-uri` flags for a child's argument list, the child's environment): a URL
    with a password goes into the environment (STORAGE_ENV, TRACKING_ENV) and not into the flags."""
    import os

    from ablate.store.commands import has_password

    env = dict(os.environ if env is None else env)
    flags: list[str] = []
    for flag, name, value in (
        ("--storage", STORAGE_ENV, stores.optuna_url()),
        ("--tracking-uri", TRACKING_ENV, stores.tracking_uri),
    ):
        env.pop(name, None)
        if not value:
            continue
        if has_password(value):
            env[name] = value
        else:
            flags += [flag, value]
    return flags, env


def passed_down(tracking_uri: str | None, storage: str | None) -> tuple[str | None, str | None]:
    """The verb's `--tracking-uri` and `--storage`, each taken from the environment (child_env) when the
    command line gave none."""
    import os

    return tracking_uri or os.environ.get(TRACKING_ENV) or None, storage or os.environ.get(
        STORAGE_ENV
    ) or None
