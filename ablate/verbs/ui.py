"""`ablate ui`: MLflow's UI over the workspace store (ablate.store.server)."""

from __future__ import annotations

from typing import Any

from ablate.verbs.options import Shared, shared


@shared("workspace", "tracking_uri")
def ui(host: str = "127.0.0.1", port: int = 5000, **options: Any) -> int:
    """Start the MLflow UI over the workspace store.

    Args:
        host: interface to listen on (127.0.0.1: this machine only)
        port: port to listen on
    """
    from ablate.store.server import serve_ui

    opts = Shared(**options)
    return serve_ui(opts.stores, host=host, port=port)
