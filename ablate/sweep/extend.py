"""Extending a budgeted study: its `budgets` gain larger values, nothing else changes.

A finished trial of a budgeted study records each budget's run (`budget_run:<steps>`). When the recipe's
budgets are no longer all among them, the plan is pending again and gets a new trial with the same plan:
its longest run is new and continues from the stable-phase state the previous longest run kept
(ablate.train.branches); every budget already finished is returned as finished, not retrained. The
report reads each plan's latest trial, so it shows every budget once.

Anything else that changed (lr, schedule, cooldown, data, model) makes a new study, not an extension:
the study remembers its runs' configs without `train.steps` (`extension_base`) and refuses such a sweep
in one line naming the first key that differs. The stable-phase checkpoints that an extension continues from
are kept until a sweep says `--final` (`keep_or_prune_stable`), which is refused while any trial waits or runs.
"""

from __future__ import annotations

from typing import Any

from ablate.core.errors import UserError
from ablate.core.tables import si
from ablate.store import tracking
from ablate.store.study import SweepContext, is_settled, plan_key

BASE_ATTR = "extension_base"


def budgets_done(trial: Any, ctx: SweepContext) -> bool:
    """Has this settled trial run every budget its plan now asks for? (Always, without budgets.)"""
    from optuna.trial import TrialState

    run = ctx.runs.get(trial.user_attrs.get("plan"))
    if run is None or not run.budgets or trial.state != TrialState.COMPLETE:
        return True  # a pruned or diverged trial is settled for good
    finished = {int(k.split(":", 1)[1]) for k in trial.user_attrs if k.startswith("budget_run:")}
    return set(run.budgets) <= finished


def extension_base(ctx: SweepContext) -> dict[str, dict[str, Any]]:
    """Per row (variant and size), its flattened config without `train.steps`: what an extension keeps."""
    base: dict[str, dict[str, Any]] = {}
    for run in ctx.runs.values():
        # data.repeat permits passes, it changes nothing trained: an extension past one pass may set it
        config = {
            k: v for k, v in tracking.flatten(run.config).items() if k not in ("train.steps", "data.repeat")
        }
        base.setdefault(f"{run.variant}{'/' + run.size if run.size else ''}", config)
    return base


def check_extension(ctx: SweepContext, study: Any) -> None:
    """Refuse a budgeted study swept again with anything but its budgets changed; remember the base."""
    if ctx.recipe.budgets(ctx.scale) is None:
        return
    now = extension_base(ctx)
    before = study.user_attrs.get(BASE_ATTR)
    if before is None:
        study.set_user_attr(BASE_ATTR, now)
        return
    for row, config in now.items():
        was = before.get(row)
        if was is None:
            continue  # a row added to the recipe: a new plan, trained from step 0
        for key in sorted(set(config) | set(was)):
            if config.get(key) != was.get(key):
                raise UserError(
                    f"{key}: study {ctx.study_name!r} was trained with {was.get(key)!r}, the recipe now "
                    f"gives {config.get(key)!r} (row {row}); only `budgets` may change to extend a study: "
                    "that is a new study (another --workspace, or a new scale)"
                )


def enqueue_extensions(study: Any, pending: list[dict[str, Any]]) -> int:
    """A new trial for each pending plan that has a finished trial but no waiting or running one."""
    from optuna.trial import TrialState

    latest: dict[str, Any] = {}
    busy = set()
    for trial in study.get_trials(deepcopy=False):
        key = trial.user_attrs.get("plan")
        if trial.state in (TrialState.WAITING, TrialState.RUNNING):
            busy.add(key)
        elif is_settled(trial):
            latest[key] = trial
    added = 0
    for plan in pending:
        key = plan_key(plan)
        if key in latest and key not in busy:
            frozen = latest[key]
            study.enqueue_trial(
                dict(frozen.params), user_attrs={"plan": key, "extends": frozen.number}, skip_if_exists=False
            )
            added += 1
    return added


def keep_or_prune_stable(ctx: SweepContext, final: bool) -> None:
    """Print the size of a budgeted study's kept stable-phase checkpoints, or delete them (`final`)."""
    from ablate.train.branches import prune_stable, stable_size

    if final:
        refuse_final_while_busy(ctx)  # an extension may have been enqueued while this sweep trained
    runs = list(ctx.runs.values())
    files, size = (prune_stable if final else stable_size)(ctx.stores.workspace, runs)
    if final:
        print(f"[sweep {ctx.study_name}] final: deleted {files} stable-phase checkpoints ({si(size)}B)")
    elif files:
        print(
            f"[sweep {ctx.study_name}] kept {files} stable-phase checkpoints, one per (row, seed), "
            f"{si(size)}B in all: larger budgets continue from them; `--final` deletes them",
            flush=True,
        )


def refuse_final_while_busy(ctx: SweepContext) -> None:
    """`--final` deletes the stable-phase checkpoints that longer budgets continue from: refused in one line
    while any trial of the study waits or runs (an extension enqueued from an edited recipe, say), which
    would otherwise train again from step 0. Reads the study only where one exists (creates nothing)."""
    from optuna.trial import TrialState

    from ablate.store.study import open_study

    if ctx.stores.storage_url is None and not ctx.stores.workspace.journal.is_file():
        return
    try:
        study, _ = open_study(ctx, create=False)
    except UserError:  # no such study yet: nothing waits
        return
    waiting = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
    running = len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
    if waiting or running:
        raise UserError(
            f"--final: study {ctx.study_name!r} has {waiting} trials waiting and {running} running, which may "
            "continue from the stable-phase checkpoints --final deletes; run it when they have finished "
            "(`ablate status` shows them)"
        )
