"""The scale-out tests' CLI environment: one intra-op thread per process. The miniature recipe and corpus
are tests/mini_project.py's, shared with tests/e2e.

(Its own module rather than `from conftest import ...`: several test folders have a conftest.py.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
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


@contextlib.contextmanager
def training_until_a_checkpoint(recipe: Path, variant: str, workspace: Path) -> Iterator[subprocess.Popen]:
    """A real `ablate train` of `recipe`'s `variant`, in a session of its own, yielded once a checkpoint of
    it is whole; on the way out every process of that session is killed (the ranks it started too)."""
    proc = subprocess.Popen(
        cli_command("train", str(recipe), "--variant", variant, "--workspace", str(workspace)),
        cwd=recipe.parent,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        while not list(workspace.glob("runs/*/*/checkpoints/last.ckpt")):  # pytest's timeout guards hangs
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.05)
        yield proc
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
