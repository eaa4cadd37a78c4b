"""How far a sweep is (`ablate status`), read from its study and, for running trials, their MLflow runs
(nothing written).

Trials by plan: finished, running (where: host, Slurm job, devices, last heartbeat), waiting and failed
for good (diverged); attempts handed back (preempted, interrupted, worker died) are counted apart, since
their retry is one of the others.

Tokens are counted as the printed plan counts them (`ablate.sweep.estimate.trained_tokens`: the run to its
largest budget plus each smaller budget's cooldown): all of a finished trial's, and of a running trial
what its MLflow runs have logged so far (the `tokens` metric of the last logged step, per budget's run).
The ETA is the tokens left over the measured rate of one worker (a finished trial's tokens over its
duration; before any trial finished, a running trial's tokens so far over its time so far) times the
workers running now.
"""

from __future__ import annotations

import time
from typing import Any

from ablate.core.tables import format_seconds, markdown_table, si
from ablate.recipe.schema import RunSpec
from ablate.store import tracking
from ablate.store.study import (
    SweepContext,
    is_settled,
    plan_key,
    progress_counts,
    settled_plans,
    trial_plan,
)


def running_tokens(client: Any, run: RunSpec) -> int:
    """Tokens the trial of `run` has trained so far, by its MLflow runs (the longest run's, then each
    smaller budget's cooldown from its branch point): a finished one counts whole, a running one up to the
    `tokens` metric of its last logged step; one not started yet counts nothing."""
    from ablate.sweep.estimate import own_steps  # the plan's rule of which steps each budget's run trains

    experiment = client.get_experiment_by_name(tracking.experiment_name(run.recipe, run.scale))
    if experiment is None:
        return 0
    done = 0
    for part in (run, *run.branches()):
        found = [
            r
            for r in tracking.find_runs(client, experiment.experiment_id, part.key)
            if r.info.status in ("FINISHED", "RUNNING", "SCHEDULED")
        ]
        if not found:
            continue
        latest = found[0]
        steps = own_steps(run, part)
        if latest.info.status != "FINISHED":  # up to its last logged step
            reached = int(latest.data.metrics.get("tokens", 0)) // part.train.batch_tokens
            steps = range(steps.start, max(steps.start, min(steps.stop, reached)))
        done += len(steps) * part.train.batch_tokens
    return done


def status_report(ctx: SweepContext, study: Any, now: float | None = None, client: Any = None) -> str:
    """The status text; `client`: the MLflow client to read running trials' progress from (default: the
    sweep's tracking store, opened only when a trial is running)."""
    from optuna.trial import TrialState

    from ablate.sweep.estimate import trained_tokens  # the plan's count: one definition of a trial's tokens

    now = time.time() if now is None else now
    trials = study.get_trials(deepcopy=False)
    plans = {t.user_attrs.get("plan") for t in trials}
    settled = settled_plans(trials)
    finished = [t for t in settled.values() if t.state == TrialState.COMPLETE]
    failed = [t for t in settled.values() if t.state == TrialState.FAIL]
    running = [t for t in trials if t.state == TrialState.RUNNING]
    gone = {t.number: why for t in running if (why := _gone_reason(t, ctx.grace_period, now))}
    stale = [t for t in running if t.number in gone]
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    handed_back = [t for t in trials if t.state == TrialState.FAIL and not is_settled(t)]

    def run_of(trial: Any) -> RunSpec:
        return ctx.run_for_plan(trial_plan(trial), dict(trial.params))

    all_tokens = sum(trained_tokens(ctx.run_for_plan(p)) for p in ctx.plans())
    finished_tokens = {t.number: trained_tokens(run_of(t)) for t in finished}
    progress, unread = _progress(ctx, running, run_of, client)
    done_tokens = sum(finished_tokens.values()) + sum(progress.values())
    left_tokens = sum(
        trained_tokens(ctx.run_for_plan(p)) for p in ctx.plans() if plan_key(p) not in settled
    ) - sum(progress.values())

    # tokens per second of one worker: finished trials' when there are any, else running trials' so far
    spans = [
        (finished_tokens[t.number], (t.datetime_complete - t.datetime_start).total_seconds())
        for t in finished
        if t.datetime_complete and t.datetime_start
    ] or [
        (progress[t.number], now - t.datetime_start.timestamp())
        for t in running
        if progress.get(t.number) and t.datetime_start
    ]
    rates = [tokens / seconds for tokens, seconds in spans if seconds > 0]
    _, total, _ = progress_counts(study)
    live = len(running) - len(stale)
    eta, how = ("done", "") if len(plans) == len(settled) else ("-", "")
    if eta == "-" and rates and running:
        eta = format_seconds(max(0, left_tokens) / (sum(rates) / len(rates)) / max(1, live))
        how = (
            " (at the tokens/s one worker measured, over the workers running now)"
            if live
            else (" (at one worker's tokens/s, once a worker runs: no live worker now)")
        )
    lines = [
        f"sweep {ctx.study_name}: {len(finished)}/{total} trials finished, {live} running"
        + (f", {len(stale)} stale (worker gone: {'; '.join(dict.fromkeys(_kinds(gone)))})" if stale else "")
        + f", {len(waiting)} waiting, {len(failed)} failed (diverged); {len(handed_back)} attempts handed "
        "back (preempted, interrupted or worker died) and retried",
        f"tokens: {si(done_tokens)} of {si(all_tokens)} done; ETA {eta}{how}",
    ]
    lines += [f"not read: {line}" for line in unread] + _lock_lines(ctx, study, now)
    if running:
        lines.append(_running_table(running, gone, run_of, now))
    return "\n".join(lines)


def _gone_reason(trial: Any, grace_period: float, now: float) -> str | None:
    """Why a RUNNING trial's worker is gone (ablate.sweep.queue.gone_reason: the rule the workers apply),
    or None; a worker that never beat counts from the trial's start."""
    from ablate.sweep.queue import gone_reason

    attrs = trial.user_attrs
    beat = attrs.get("heartbeat") or (trial.datetime_start.timestamp() if trial.datetime_start else None)
    return gone_reason(attrs.get("worker_host"), attrs.get("worker_pid"), beat, grace_period, now)


def _kinds(gone: dict[int, str]) -> list[str]:
    """The summary's words for the stale trials' reasons (each trial's own, with its numbers, is in the
    table's state column, so the line and the table say the same)."""
    return [
        "its process ended" if "process" in why else "no heartbeat past the grace period"
        for why in gone.values()
    ]


def _progress(ctx: SweepContext, running: list, run_of: Any, client: Any) -> tuple[dict[int, int], list[str]]:
    """Tokens so far of each running trial, and the trials whose progress the tracking store did not give."""
    progress: dict[int, int] = {}
    unread: list[str] = []
    if not running:
        return progress, unread
    from mlflow.exceptions import MlflowException

    client = client or ctx.stores.client()
    for t in running:
        try:
            progress[t.number] = running_tokens(client, run_of(t))
        except (MlflowException, OSError) as e:  # the store unreachable, or it failed to answer
            run_id = t.user_attrs.get("mlflow_run_id")
            unread.append(
                f"trial {t.number} ({run_of(t).name}{', MLflow run ' + run_id if run_id else ''}): "
                f"its tokens so far not read, counted as none ({tracking.first_line(e)})"
            )
    return progress, unread


def _lock_lines(ctx: SweepContext, study: Any, now: float) -> list[str]:
    """Who holds the study's sweep lock (ablate.sweep.lock), if anyone, and whether that holder is gone."""
    from ablate.store.study import SWEEP_LOCK_SUFFIX
    from ablate.sweep.queue import gone_reason

    storage = getattr(study, "_storage", None)
    try:
        sid = storage.get_study_id_from_name(ctx.study_name + SWEEP_LOCK_SUFFIX)
        attrs = storage.get_study_user_attrs(sid)
    except (AttributeError, KeyError):
        return []
    beat = attrs.get("heartbeat")
    why = gone_reason(attrs.get("host"), attrs.get("pid"), beat, ctx.grace_period, now)
    return [
        f"sweep lock: held by host {attrs.get('host', '?')}, pid {attrs.get('pid', '?')}, "
        + (f"heartbeat {now - float(beat):.0f} s ago" if beat else "no heartbeat written")
        + (f"; stale ({why}): its holder is gone, the next `ablate sweep` takes it over" if why else "")
    ]


def _running_table(running: list, gone: dict[int, str], run_of: Any, now: float) -> str:
    rows = []
    for t in running:
        attrs = t.user_attrs
        beat = attrs.get("heartbeat")
        rows.append(
            [
                t.number,
                run_of(t).name,
                f"stale: {gone[t.number]}" if t.number in gone else "running",
                attrs.get("worker_host", "?"),
                attrs.get("slurm_job", "-"),
                attrs.get("devices", "-"),
                f"{now - float(beat):.0f} s ago" if beat else "-",
            ]
        )
    return markdown_table(["trial", "run", "state", "host", "slurm job", "devices", "last heartbeat"], rows)
