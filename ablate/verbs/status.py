"""`ablate status`: how far a running sweep is, read from its study (ablate.sweep.status)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ablate.verbs.options import Shared, shared, sweep_context


@shared("scale", "seeds", "workspace", "tracking_uri", "storage", "search", "grace_period")
def status(recipe: str, *, overrides: list | None = None, **options: Any) -> int:
    """How far a sweep is: trials finished / running (host, Slurm job) / waiting / failed, tokens, ETA.

    Args:
        recipe: recipe YAML file of the sweep
    """
    from ablate.store.study import load_finished_study
    from ablate.sweep.status import status_report

    opts = Shared(**options)
    ctx = sweep_context(recipe, opts, opts.search, opts.grace_period, overrides)
    ctx = dataclasses.replace(ctx, stores=dataclasses.replace(ctx.stores, read_only=True))  # reads only
    print(status_report(ctx, load_finished_study(ctx, "ablate status")))
    return 0
