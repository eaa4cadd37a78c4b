"""One MLflow tracking server that workers on many machines log to (`ablate server`), and the UI (`ablate ui`).

The server keeps runs in a SQL backend store (PostgreSQL for many machines; SQLite in the workspace by
default) and serves artifacts itself (`--serve-artifacts`): workers upload through HTTP into one folder
on the server's machine, so they need no shared filesystem and no cloud credentials. It listens on
127.0.0.1 unless `--host` says otherwise. The command line is an argument list: nothing reaches a shell.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from ablate.core.errors import UserError
from ablate.core.processes import process_table, python_command
from ablate.core.workspace import Workspace
from ablate.store import comparison, tracking
from ablate.store.commands import has_password, redact
from ablate.store.sqlite_store import sqlite_path, sqlite_url
from ablate.store.stores import Stores

WILDCARD_HOSTS = ("0.0.0.0", "::", "")  # binds to every interface
READY_TIMEOUT = 180.0  # seconds; the first start on an empty database runs MLflow's migrations


def server_command(
    backend_store_uri: str,
    artifacts: Path,
    host: str,
    port: int,
    workers: int = 1,
    allowed_hosts: str | None = None,
) -> list[str]:
    """The `mlflow server` argument list."""
    cmd = [
        *python_command("-m", "mlflow", "server", tool=True),
        *store_argument(backend_store_uri),
        "--serve-artifacts",
        "--artifacts-destination",
        artifacts.absolute().as_uri(),  # a relative --artifacts is taken from the current folder
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]
    if allowed_hosts:
        cmd += ["--allowed-hosts", allowed_hosts]
    return cmd


def store_argument(uri: str) -> list[str]:
    """`--backend-store-uri URI` for the `mlflow` child's argument list, or nothing where the URI holds a
    password: anyone on the machine reads a command line (`ps`), so that one goes through the child's
    environment instead (`store_env`)."""
    return [] if has_password(uri) else ["--backend-store-uri", uri]


def store_env(uri: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """The `mlflow` child's environment: `env` (default this process's), with the backend store URI in
    MLFLOW_BACKEND_STORE_URI (the variable `mlflow server` reads for --backend-store-uri) where it holds a
    password."""
    env = dict(os.environ if env is None else env)
    if has_password(uri):
        env["MLFLOW_BACKEND_STORE_URI"] = uri
    return env


def child_store(uri: str) -> tuple[str, Path | None]:
    """The backend store URL the `mlflow` child is given, and the folder it starts in. A SQLite file is
    named relative to its own folder, the child's working folder: MLflow creates a SQLite URL's parent
    folder from the URL's text without decoding it, so the quoted URL of a workspace `ws?q=1` would leave
    an empty `ws%3Fq%3D1` folder beside it (this process's MLflow is patched: sqlite_store)."""
    if not uri.startswith("sqlite:///") or uri.removeprefix("sqlite:///") in ("", ":memory:"):
        return uri, None
    path = sqlite_path(uri).absolute()
    return sqlite_url(Path(path.name)), path.parent


def backend_store(uri: str | None, workspace: Workspace) -> str:
    """The backend store URL: the user's (a SQLAlchemy URL) or the workspace's SQLite file."""
    if uri is None:
        return Stores(workspace).mlflow_uri()
    if uri.startswith(("http:", "https:")) or "://" not in uri:
        raise UserError(
            f"--backend-store-uri: {uri!r} is not a database URL; use postgresql://user@host/db "
            "or sqlite:///path/mlflow.db"
        )
    return tracking.database_url(uri)


def url_for(host: str, port: int) -> str:
    """The address clients use; a wildcard bind is reached through the loopback address here."""
    shown = "127.0.0.1" if host in WILDCARD_HOSTS else host
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"


def wait_ready(proc: subprocess.Popen, url: str, timeout: float = READY_TIMEOUT) -> None:
    """Block until the server answers /health; UserError if it exits or does not answer in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise UserError(
                f"ablate server: mlflow server exited with code {proc.returncode} before it "
                "was ready (see its output above: port in use? database unreachable?)"
            )
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:  # noqa: S310 (our own URL)
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise UserError(f"ablate server: no answer from {url}/health within {timeout:.0f} s")


def serve(
    *,
    workspace: Workspace,
    backend_store_uri: str | None = None,
    artifacts: Path | None = None,
    host: str = "127.0.0.1",
    port: int = 5000,
    workers: int = 1,
    allowed_hosts: str | None = None,
) -> int:
    """Start the server, print its URL once it answers, and run until interrupted or terminated."""
    if not 0 < port < 65536:
        raise UserError(f"--port: expected 1-65535, got {port}")
    if workers < 1:
        raise UserError(f"--workers: expected a positive number, got {workers}")
    store = backend_store(backend_store_uri, workspace)
    artifacts = Path(artifacts) if artifacts else workspace.create().artifacts
    try:
        artifacts.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--artifacts: cannot create {artifacts}: {e.strerror or e}") from None
    artifacts = artifacts.resolve()
    url = url_for(host, port)

    def ready() -> None:
        remote = f"http://{socket.getfqdn()}:{port}" if host in WILDCARD_HOSTS else url  # wildcard bind
        print(
            f"MLflow server on {url}  (backend store {_redact(store)}, artifacts {artifacts})\n"
            f"workers: --tracking-uri {remote}",
            flush=True,
        )

    child, folder = child_store(store)
    cmd = server_command(child, artifacts, host, port, workers, allowed_hosts)
    return run_until_stopped(cmd, url, ready, env=store_env(child), cwd=folder)


def ui_command(backend_store_uri: str, artifacts_uri: str, host: str, port: int) -> list[str]:
    """The `mlflow ui` argument list (one worker: a person's browser, not a fleet of training workers)."""
    return [
        *python_command("-m", "mlflow", "ui", tool=True),
        *store_argument(backend_store_uri),
        "--default-artifact-root",
        artifacts_uri,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
        "--uvicorn-opts",
        "--log-level warning",  # no line per request: the link stays the last line printed
    ]


def serve_ui(stores: Stores, host: str = "127.0.0.1", port: int = 5000) -> int:
    """`ablate ui`: `mlflow ui` over the workspace store until interrupted or terminated; once it answers,
    one link: the newest experiment's runs as a comparison of its variants (ablate.store.comparison).

    Every experiment is tagged as a training experiment first (stores written before the tag existed)
    and given the comparison view. MLflow's job consumers (GenAI judges and scorers) are not started:
    comparing training runs needs none of them.
    """
    if stores.tracking_uri and stores.tracking_uri.startswith("http"):
        print(f"the tracking server is already a UI: open {stores.tracking_uri}")
        return 0
    if not 0 < port < 65536:
        raise UserError(f"--port: expected 1-65535, got {port}")
    uri = stores.mlflow_uri()
    artifacts = stores.workspace.create().artifacts.as_uri()
    client = stores.client()
    experiments = [
        e for e in client.search_experiments(order_by=["last_update_time DESC"]) if e.name != "Default"
    ]
    for experiment in experiments:
        tracking.mark_training_experiment(client, experiment)
        comparison.save_view(client, experiment.experiment_id)
    url = url_for(host, port)

    def ready() -> None:
        if not experiments:
            print(f"MLflow UI: {url}  (no experiment in {uri} yet; Ctrl-C stops it)", flush=True)
            return
        newest, *others = experiments
        print(f"MLflow UI: {comparison.view_url(url, newest.experiment_id)}  (Ctrl-C stops it)", flush=True)
        if others:
            names = ", ".join(e.name for e in others)
            print(f"  {newest.name}; the UI's Experiments page lists the others: {names}", flush=True)

    child, folder = child_store(uri)
    env = {**store_env(child), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    # A browser's UI over a local store: nothing in flight is worth waiting for (`ablate server`, whose
    # workers may be uploading, gives uvicorn longer), so Ctrl-C frees the port within a few seconds.
    cmd = ui_command(child, artifacts, host, port)
    return run_until_stopped(cmd, url, ready, env=env, grace=0.5, cwd=folder)


def run_until_stopped(
    cmd: list[str],
    url: str,
    on_ready,
    env: dict[str, str] | None = None,
    grace: float = 5.0,
    cwd: Path | None = None,
) -> int:
    """Run an MLflow server command until it exits, Ctrl-C or SIGTERM; on any of them stop its whole
    process group (uvicorn workers, job consumers): nothing is left holding the port."""
    # Its own process group: `mlflow server`/`ui` run uvicorn and job consumers in child processes.
    proc = subprocess.Popen(cmd, start_new_session=True, env=env, cwd=cwd)

    def stop(signum: int, frame: object) -> None:  # SIGTERM: stop the server too, then exit
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        wait_ready(proc, url)
        on_ready()
        return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        _stop_group(proc, grace)


def _stop_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM to the whole group, SIGKILL to whatever of it is left after `grace` seconds (uvicorn takes
    seconds to end on a busy machine, MLflow's job consumers half a minute). The group outlives its
    leader when `mlflow` exits before its workers, so it is the group that is waited for."""
    deadline = time.monotonic() + grace
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        while time.monotonic() < deadline and _group_alive(proc):
            time.sleep(0.1)
        if not _group_alive(proc):
            break
        deadline = time.monotonic() + 10.0
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=1)


def _group_alive(proc: subprocess.Popen) -> bool:
    """Whether a process of `proc`'s group still runs. Zombies do not count: a killed worker whose parent
    died too waits for init to reap it, which a container's init may take seconds to do."""
    proc.poll()  # reap the leader, or it stays a zombie member of its own group
    if not Path("/proc").is_dir():  # no procfs (macOS): a signal 0 to the group, zombies included
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return any(int(pgrp) == proc.pid and state != "Z" for state, _ppid, pgrp, *_ in process_table().values())


def _redact(url: str) -> str:
    """The URL without a password (ablate.store.commands.redact)."""
    return redact(url)
