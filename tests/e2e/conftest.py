"""The e2e fixtures (helpers: tests/mini_project.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mini_project import write_recipe


@pytest.fixture
def mini_recipe(tmp_path: Path) -> Path:
    return write_recipe(tmp_path)


@pytest.fixture(scope="session")
def finished_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The workspace of a finished 2-variant x 2-seed mini sweep (built once; the UI tests only read it)."""
    from ablate.cli import main

    folder = tmp_path_factory.mktemp("finished-sweep")
    recipe = write_recipe(folder)
    workspace = folder / "ws"
    argv = ["sweep", str(recipe), "--seeds", "0", "1", "--yes", "--workspace", str(workspace)]
    assert main([*argv, "--reports", str(folder / "reports")]) == 0
    return workspace
