"""The e2e fixtures (helpers: e2e_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import write_recipe


@pytest.fixture
def mini_recipe(tmp_path: Path) -> Path:
    return write_recipe(tmp_path)
