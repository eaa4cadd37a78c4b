"""`ablate worker`: join a sweep's study and train its waiting trials, here (this process) or as worker jobs
a launcher starts elsewhere (`--launcher slurm --workers N`: ablate.sweep.launchers).
"""

from __future__ import annotations

from typing import Any

from ablate.core.errors import UserError
from ablate.verbs.options import Shared, launcher_start, shared, sweep_context


@shared("scale", "seeds", "workspace", "tracking_uri", "storage", "search", "grace_period")
def worker(
    recipe: str,
    launcher: str | None = None,
    workers: int = 1,
    *,
    overrides: list | None = None,
    **options: Any,
) -> int:
    """Join an existing sweep's study and run its waiting trials.

    Args:
        recipe: recipe YAML file of the sweep
        launcher: local (this process) or slurm (submit --workers worker jobs); default: the recipe's
        workers: with --launcher slurm, worker jobs to submit
    """
    import socket

    from ablate.store.study import open_study
    from ablate.sweep.queue import placement
    from ablate.sweep.worker import work
    from ablate.verbs.sweep import after_trial

    opts = Shared(**options)
    ctx = sweep_context(recipe, opts, opts.search, opts.grace_period, overrides)
    if workers < 1:
        raise UserError(f"--workers: expected a positive number, got {workers}")
    here = (launcher or ctx.recipe.file.launcher.name) == "local"
    if here and workers != 1:
        raise UserError(
            "--workers: a local `ablate worker` is one process; start more, use `ablate sweep --workers N`, "
            "or --launcher slurm to submit N worker jobs"
        )
    start = None if here else launcher_start(ctx, launcher, workers, wait=False, overrides=overrides)
    study, store = open_study(ctx, create=False)
    if start is not None:
        start(study, store)
        return 0
    placed = "".join(f", {k} {v}" for k, v in placement().items())
    print(f"[worker] on {socket.gethostname()}{placed}", flush=True)
    trained = work(ctx, study, store, after_trial=after_trial(ctx))
    print(f"[worker] trained {trained} trials; no waiting trials left", flush=True)
    return 0
