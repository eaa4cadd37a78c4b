"""`ablate server`: an MLflow tracking server that workers on many machines log to (ablate.store.server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ablate.verbs.options import Shared, shared


@shared("workspace")
def server(
    backend_store_uri: str | None = None,
    artifacts: str | None = None,
    host: str = "127.0.0.1",
    port: int = 5000,
    workers: int = 1,
    allowed_hosts: str | None = None,
    **options: Any,
) -> int:
    """Start an MLflow tracking server (SQL store, served artifacts) for many workers.

    Args:
        backend_store_uri: SQL store, e.g. postgresql://user@dbhost/mlflow (default: SQLite in the workspace)
        artifacts: folder the server keeps artifacts in (default <workspace>/artifacts)
        host: interface to listen on (127.0.0.1: this machine only)
        port: port to listen on
        workers: server processes
        allowed_hosts: Host headers to accept besides localhost and private IPs, e.g. mlflow.example.org:5000
    """
    from ablate.store.server import serve

    return serve(
        workspace=Shared(**options).layout,
        backend_store_uri=backend_store_uri,
        artifacts=Path(artifacts) if artifacts else None,
        host=host,
        port=port,
        workers=workers,
        allowed_hosts=allowed_hosts,
    )
