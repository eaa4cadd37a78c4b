"""The worker loop: claim a waiting trial of the study, train its run, tell the study, until none is left.

Every worker runs this, whatever started it (`ablate sweep` in its own process, a local worker process,
a Slurm array task: `ablate.sweep.launchers`). What the sweep does once a trial's run ends (probes, say)
comes in as `after_trial`, so this loop knows nothing above training.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import lightning as L

from ablate.core.errors import UserError
from ablate.core.tables import format_seconds
from ablate.recipe.schema import RunSpec
from ablate.recipe.search import point_label
from ablate.store import names, tracking
from ablate.store.study import SweepContext, progress_counts, trial_plan
from ablate.sweep import preemption
from ablate.sweep.queue import (
    Heartbeat,
    TrialTakenOver,
    claim_waiting,
    hand_back,
    recover_stale,
)

# What runs when a trial's run has finished, before the trial is told: (the run, its MLflow run id).
AfterTrial = Callable[[RunSpec, str], None]


def parent_run_id(ctx: SweepContext, study: Any) -> str:
    """The study's MLflow parent run (created once, remembered in the study; found again by its tags when
    the study has lost it)."""
    known = study.user_attrs.get(names.PARENT_RUN_ATTR)
    if known:
        return known
    client = ctx.stores.client()
    experiment_id = tracking.get_experiment_id(
        client, tracking.experiment_name(ctx.recipe.name, ctx.scale), ctx.stores.workspace
    )
    sweep = f"tags.`{names.STUDY}` = '{ctx.study_name}' AND tags.`{names.ROLE}` = '{names.SWEEP_ROLE}'"
    found = client.search_runs([experiment_id], filter_string=sweep)
    if found:
        run_id = found[0].info.run_id
    else:
        tags = {
            names.STUDY: ctx.study_name,
            names.ROLE: names.SWEEP_ROLE,
            names.RECIPE: ctx.recipe.name,
            names.SCALE: ctx.scale,
            names.CODE_VERSION: tracking.code_version(),
        }
        run_id = client.create_run(experiment_id, run_name=f"sweep {ctx.study_name}", tags=tags).info.run_id
    study.set_user_attr(names.PARENT_RUN_ATTR, run_id)
    return run_id


def work(
    ctx: SweepContext, study: Any, storage: Any, workers: int = 1, after_trial: AfterTrial | None = None
) -> int:
    """Run trials until none is waiting or running elsewhere; returns the number this process trained.
    `after_trial`: what the sweep does with each finished run before its trial is told (probes)."""
    expected = study.user_attrs.get("recipe_key")
    if (
        expected and expected != ctx.recipe_key()
    ):  # a worker elsewhere with an edited recipe or other overrides
        raise UserError(
            f"--storage: study {ctx.study_name!r} was enqueued from another version of the recipe "
            "(file, --scale or overrides differ); start the worker with the same ones as `ablate sweep`"
        )
    trained = 0
    parent = parent_run_id(ctx, study)
    while True:
        preemption.stop_if_warned()  # a warned worker (ablate.sweep.preemption) takes no new trial
        trial = claim_waiting(study, storage)
        if trial is None:
            if recover_stale(study, storage, ctx.grace_period):
                continue
            unsettled = unsettled_states(study)
            if not unsettled:
                return trained
            if "RUNNING" in unsettled:
                time.sleep(1.0)  # others are still running: one of them may die and need a retry
            continue
        run_trial(ctx, study, storage, trial, parent, workers, after_trial)
        trained += 1


def unsettled_states(study: Any) -> set[str]:
    """Which of WAITING and RUNNING the study's trials are in, read from one look at the storage: a
    trial handed back between two looks (its retry enqueued, then the trial failed) is seen as one or
    the other, never as neither, so no worker leaves while a retry waits."""
    from optuna.trial import TrialState

    wanted = (TrialState.WAITING, TrialState.RUNNING)
    return {t.state.name for t in study.get_trials(deepcopy=False, states=wanted)}


def run_trial(
    ctx: SweepContext,
    study: Any,
    storage: Any,
    trial: Any,
    parent: str,
    workers: int,
    after_trial: AfterTrial | None = None,
) -> None:
    import optuna

    from ablate.train.branches import train_budgets
    from ablate.train.module import Diverged

    plan = trial_plan(trial)
    sampled = {d.key: d.suggest(trial) for d in ctx.search.dimensions}  # enqueued grid points come back fixed
    run = ctx.run_for_plan(plan, sampled)
    heartbeat = Heartbeat(trial, storage, ctx.grace_period)
    try:
        trial_tags = {names.TRIAL: str(trial.number), names.STUDY: ctx.study_name}
        client, run_id = _open_trial_run(ctx, trial, run, parent, trial_tags)
        _print_progress(ctx, study, run, workers, sampled)

        def record_budget(budget_run: RunSpec, budget_result: Any) -> None:  # each budget's run, as it ends
            if run.budgets:
                trial.set_user_attr(f"budget_run:{budget_run.train.steps}", budget_result.run_id)

        # One training per trial; with budgets (ablate.recipe.budgets) the smaller ones branch off it.
        result = train_budgets(
            run,
            ctx.stores,
            parent_run_id=parent,
            progress=ctx.progress,
            extra_tags=trial_tags,
            callbacks=_trial_callbacks(ctx, trial),
            every_run_callbacks=[StopWhenTakenOver(heartbeat)],  # a budget's cooldown branch too
            on_result=record_budget,
            folder_wait=ctx.grace_period,  # a worker that lost the trial stops at its next step
        )[0]
    except TrialTakenOver as e:  # the other worker trains it now: not handed back again
        heartbeat.stop()
        print(f"[sweep] {run.name}: stopped training: {e}; this worker goes on with other trials", flush=True)
        return
    except Diverged as e:
        heartbeat.stop()
        trial.set_user_attr("failure_reason", f"diverged: {e}")
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        print(f"[sweep] {run.name} diverged ({e}); marked failed, going on", flush=True)
        return
    except optuna.TrialPruned as e:
        heartbeat.stop()
        client.set_tag(run_id, names.PRUNED, str(e))
        client.set_terminated(run_id, status="KILLED")
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return
    except BaseException as e:  # a user error, Ctrl-C or a bug: hand the trial back for the next attempt
        heartbeat.stop()
        reason = (
            f"preempted: {e}" if isinstance(e, preemption.Preempted) else f"interrupted: {type(e).__name__}"
        )
        hand_back(study, storage, study.get_trials(deepcopy=False)[trial.number], reason)
        raise
    if after_trial is not None:
        after_trial(run, result.run_id)
    heartbeat.stop()
    study.tell(trial, result.val_loss)
    print(f"[sweep] {result.summary()}", flush=True)


def _open_trial_run(
    ctx: SweepContext, trial: Any, run: RunSpec, parent: str, trial_tags: dict[str, str]
) -> tuple[Any, str]:
    """(MLflow client, run id) of the trial's run, opened or resumed under the sweep's parent run; the
    trial remembers which run it is (its plan's variant, seed, size, run key and name, the run's id)."""
    client = ctx.stores.client()
    _, run_id = tracking.open_run(
        client, run, ctx.stores.workspace, parent_run_id=parent, extra_tags=trial_tags
    )
    for key, value in {
        "variant": run.variant,
        "seed": run.seed,
        "size": run.size or "",
        "run_key": run.key,
        "run_name": run.name,
        "mlflow_run_id": run_id,
    }.items():
        trial.set_user_attr(key, value)
    return client, run_id


def _trial_callbacks(ctx: SweepContext, trial: Any) -> list[L.Callback]:
    """What watches the trial's training: the search's pruner, and under Slurm the checkpoint saved on the
    preemption warning (its step kept on the trial)."""
    from ablate.train.pruning import PruningCallback

    callbacks: list[L.Callback] = []
    if ctx.search.pruner.get("name", "none") != "none":
        callbacks.append(PruningCallback(trial))
    if preemption.armed():
        callbacks.append(
            preemption.CheckpointOnWarning(lambda step: trial.set_user_attr("preempted_at", step))
        )
    return callbacks


class StopWhenTakenOver(L.Callback):
    """Stops training at the end of the step in which the heartbeat found the trial taken over."""

    def __init__(self, heartbeat: Heartbeat):
        self.heartbeat = heartbeat

    def on_train_batch_end(self, *args: Any) -> None:
        self.heartbeat.check()


def _print_progress(
    ctx: SweepContext, study: Any, run: RunSpec, workers: int, sampled: dict[str, Any] | None = None
) -> None:
    done, total, durations = progress_counts(study)
    eta = ""
    if durations:
        remaining = max(0, total - done) * (sum(durations) / len(durations)) / max(1, workers)
        eta = f", ETA {format_seconds(remaining)}"
    # a searched point names itself (`lr=0.003`): the trials of one run name differ only there
    point = f", {point_label(tuple(sampled.items()))}" if sampled else ""
    print(
        f"[sweep {ctx.study_name}] trial {done + 1}/{total}: {run.name} ({run.label}{point}){eta}", flush=True
    )


def worker_argv(ctx: SweepContext, overrides_argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """`ablate worker ...` arguments (after `ablate`) that join this sweep's study, and the environment to
    start it in: a store URL with a password travels there, never in the arguments (ps shows those)."""
    from ablate.store.stores import child_env

    stores = ctx.stores
    flags, env = child_env(stores)
    argv = ["worker", str(ctx.recipe.path), "--scale", ctx.scale, *flags]
    argv += ["--workspace", str(stores.workspace), "--seeds", *map(str, ctx.seeds)]
    if ctx.search_path:
        argv += ["--search", ctx.search_path]
    return argv + overrides_argv, env
