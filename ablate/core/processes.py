"""The processes this one starts and watches: whether a process of this machine is alive (the one answer the
sweep's liveness rule and a report folder's leftovers both need), and the one way a Python child is started.

A Python child started as `python -m module` puts its current folder first on its import path, and reads
`PYTHONPATH`, `PYTHONSTARTUP`'s kin and the user's site folder: a `pip.py` (or `torch.py`) in the folder a
command was started from would run in the child in place of the module. So every child is started through
`python_command`: a tool (pip, MLflow's server) with `-I`, isolated from the current folder, every
`PYTHON*` variable and the user's site; an `ablate` child (a local worker, a DDP rank, a Slurm task) with
`-P` (no folder put first on its path) and the import folder its parent was started with handed down
(`child_environment`), so it imports the plugins its parent imports (a recipe's `imports:`, through
`PYTHONPATH` or `python -m ablate.cli` in their folder) and nothing its parent would not.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Is process `pid` of this machine running? A zombie (killed, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0): ask /proc where there is one.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def process_table() -> dict[int, list[str]]:
    """Every process of this machine, read from /proc now: its pid -> the fields of its `stat` after its
    name (state, ppid, pgrp, ...). A process that ended while it was read is left out; {} without /proc."""
    table: dict[int, list[str]] = {}
    proc_fs = Path("/proc")
    if not proc_fs.is_dir():
        return table
    for entry in proc_fs.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        table[int(entry.name)] = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    return table


ISOLATED = "-I"  # a tool's child: no current folder, no PYTHON* variables, no user site
SAFE_PATH = "-P"  # an ablate child: no current folder first on its path (PYTHONPATH kept: the user's plugins)


def python_command(*args: str, tool: bool = False) -> list[str]:
    """This interpreter on `args` (`"-m", "pip", ...`): `-I` for a tool, `-P` for an ablate child (whose
    environment comes from `child_environment`)."""
    return [sys.executable, ISOLATED if tool else SAFE_PATH, *args]


def child_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) for an ablate child started by `python_command`: where this process
    was started as `python -m ...` (its first import folder is its current folder), that folder is handed
    down on `PYTHONPATH`, by its absolute path, so the child imports what its parent imports."""
    env = dict(os.environ if env is None else env)
    first = own_folder()
    if first is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [first, env.get("PYTHONPATH", "")]))
    return env


def own_folder() -> str | None:
    """The current folder when this process put it first on its own import path (`python -m`), else None."""
    if sys.flags.safe_path or sys.flags.isolated or not sys.path:
        return None
    first = sys.path[0]
    try:
        return os.getcwd() if first in ("", ".") or Path(first).resolve() == Path.cwd().resolve() else None
    except OSError:
        return None
