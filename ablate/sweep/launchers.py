"""Where a sweep's workers run: one module per launcher, named in `LAUNCHERS`.

A launcher module has `start(ctx, workers, *, overrides_argv, wait, after_trial)`: it checks what it can
before anything is enqueued (the cluster, the stores the workers will reach) and returns what starts the
workers on a study, `run(study, storage) -> bool`: True once every trial is settled (the sweep then
reports), False when they go on elsewhere (`ablate report` comes later). Workers started elsewhere are
`ablate worker` processes with `worker_argv`'s arguments. A new launcher is a module beside these and a
line here; a recipe chooses it with `launcher: {name: NAME}` or `--launcher NAME`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ablate.core.errors import UserError, closest

LAUNCHERS = {
    "local": "ablate.sweep.local",  # this machine: the sweep's process, or N worker processes
    "slurm": "ablate.sweep.slurm",  # a Slurm job array of workers, through submitit
}


def launcher(name: str, key: str = "--launcher") -> ModuleType:
    """The launcher module called `name`; an unknown name is one line with the known ones."""
    if name not in LAUNCHERS:
        raise UserError(
            f"{key}: unknown launcher {name!r}{closest(name, LAUNCHERS)}; launchers: {', '.join(LAUNCHERS)}"
        )
    return importlib.import_module(LAUNCHERS[name])
