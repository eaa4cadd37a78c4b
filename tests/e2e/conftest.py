"""The e2e fixtures (helpers: tests/mini_project.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mini_project import write_recipe


@pytest.fixture
def mini_recipe(tmp_path: Path) -> Path:
    return write_recipe(tmp_path)
