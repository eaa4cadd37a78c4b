"""Fixtures for the whole suite (each folder's conftest.py has its own).

One thread for torch, here and in every `ablate` the tests start (OMP_NUM_THREADS, set before anything
imports torch, unless the caller set it): the suite's models are tiny, and on a busy 2-core machine
OpenMP's spinning threads made a mini model's backward 14-30x slower than one thread. The cores are used
by pytest-xdist instead (pyproject's addopts: one test process per core, up to 4).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The scaleout tests (a PostgreSQL server, a Slurm cluster, several workers each) run one after
    another on one pytest-xdist worker (`--dist loadgroup`): each starts several processes of its own, and
    the session fixtures that start the servers then start once."""
    for item in items:
        if item.get_closest_marker("scaleout"):
            item.add_marker(pytest.mark.xdist_group("scaleout"))


@pytest.fixture(scope="session", autouse=True)
def _embedded_mlflow_stores_from_one_migration(tmp_path_factory: pytest.TempPathFactory):
    """A new embedded MLflow store (an empty SQLite file) opened in this process starts as a copy of one
    that MLflow's own code created and migrated once per test run, instead of running MLflow's ~60 schema
    migrations again (seconds each time; some hundred tests open a fresh store in-process). The copy is
    that database, byte for byte; everything after it is MLflow's. The real migration still runs here for
    that one store, in every `ablate` the tests start in a fresh interpreter, for every server store
    (PostgreSQL), and where ablate migrates an older MLflow's store (ablate.store.sqlite_store)."""
    try:
        from mlflow.store.db import utils
    except ImportError:  # nothing here opens an MLflow store
        yield
        return
    real = utils._initialize_tables
    template = None

    def initialize_tables(engine) -> None:
        nonlocal template
        database = engine.url.database
        if engine.dialect.name != "sqlite" or not database or database == ":memory:":
            real(engine)
            return
        if template is None:
            import sqlalchemy

            path = tmp_path_factory.mktemp("mlflow-store") / "mlflow.db"
            once = sqlalchemy.create_engine(f"sqlite:///{path}")
            real(once)
            once.dispose()
            template = path
        with (
            contextlib.closing(sqlite3.connect(template)) as source,
            contextlib.closing(sqlite3.connect(database)) as target,
        ):
            source.backup(target)

    utils._initialize_tables = initialize_tables
    yield
    utils._initialize_tables = real


@pytest.fixture(autouse=True)
def _torch_deterministic_flag_restored():
    """Each test starts with torch's deterministic-algorithms flag as the session had it: a run trained
    in-process with `train.deterministic` turns it on (Lightning does not turn it back off), and a later
    test on the same worker would otherwise run its kernels under it (the `triton` backend's backward,
    for one, takes its deterministic path then)."""
    import torch

    flag = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.use_deterministic_algorithms(flag, warn_only=warn_only)
