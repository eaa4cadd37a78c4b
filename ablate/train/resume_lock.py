"""One process trains a run folder at a time.

A run is resumed wherever its MLflow run is RUNNING and its folder has a checkpoint (that is how a killed
run goes on), so nothing in the stores tells a dead attempt from a live one; two processes resuming the
same run would write one folder's checkpoints in turn. The training process holds an exclusive `flock`
on `<run folder>/.training.lock` while it trains: the kernel lets go of it when the process ends however it
ends (kill -9 included), so a dead holder never blocks, and the file names the holder (host, pid) for the
line that refuses a second one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from ablate.core.errors import UserError

LOCK_FILE = ".training.lock"


@contextlib.contextmanager
def training(folder: Path, wait: float = 0.0) -> Iterator[None]:
    """Hold `folder`'s training lock for the block; while another live process holds it, wait up to
    `wait` seconds (said in a line), then refuse in one line naming it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        _take(fd, path, wait)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"host {socket.gethostname()}, pid {os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the last descriptor of the open file lets go of the lock


def _take(fd: int, path: Path, wait: float) -> None:
    deadline = time.monotonic() + wait
    said = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            holder = path.read_text(errors="replace").strip() or "another process"
            if time.monotonic() >= deadline:
                raise UserError(
                    f"train: {path.parent} is being trained by another process ({holder}); stop it or let "
                    "it finish, then run again: the run resumes from its last checkpoint"
                ) from None
            if not said:
                print(
                    f"[train] {path.parent} is being trained by another process ({holder}); waiting up to "
                    f"{wait:.0f} s for it to stop",
                    flush=True,
                )
                said = True
            time.sleep(0.5)
