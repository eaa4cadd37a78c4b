"""The scale-out tests' CLI environment: one intra-op thread per process. The miniature recipe and corpus
are tests/mini_project.py's, shared with tests/e2e.

(Its own module rather than `from conftest import ...`: several test folders have a conftest.py.)
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import mini_project
from mini_project import cli_command, write_recipe

__all__ = ["cli_command", "cli_env", "run_cli", "write_recipe"]


def cli_env() -> dict[str, str]:
    # One intra-op thread per process: the tensors are tiny, and several processes share 2 cores, where
    # OpenMP threads spinning for descheduled siblings made each step 10-50x slower.
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def run_cli(*args: str, cwd: Path, timeout: float = 300, check: bool = False) -> subprocess.CompletedProcess:
    """`ablate ARGS` in a fresh interpreter with `cli_env()`."""
    return mini_project.run_cli(*args, cwd=cwd, timeout=timeout, check=check, env=cli_env())
