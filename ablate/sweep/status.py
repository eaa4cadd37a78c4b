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
from ablate.recipe.resolve import RunSpec
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
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    handed_back = [t for t in trials if t.state == TrialState.FAIL and not is_settled(t)]

    def run_of(trial: Any) -> RunSpec:
        return ctx.run_for_plan(trial_plan(trial), dict(trial.params))

    all_tokens = sum(trained_tokens(ctx.run_for_plan(p)) for p in ctx.plans())
    finished_tokens = {t.number: trained_tokens(run_of(t)) for t in finished}
    progress: dict[int, int] = {}
    unread: list[str] = []  # running trials whose progress the tracking store did not give, and why
    if running:
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
    done_tokens = sum(finished_tokens.values()) + sum(progress.values())
    left_tokens = sum(
        trained_tokens(ctx.run_for_plan(p)) for p in ctx.plans() if plan_key(p) not in settled
    ) - sum(progress.values())

    # tokens per second of one worker: finished trials' when there are any, else running trials' so far
    spans = [
        (finished_tokens[t.number], (t.datetime_complete - t.datetime_start).total_seconds())
        for t in finished
        if t.datetime_complete and t.datetime_start
    ]
    if not spans:
        spans = [
            (progress[t.number], now - t.datetime_start.timestamp())
            for t in running
            if progress.get(t.number) and t.datetime_start
        ]
    rates = [tokens / seconds for tokens, seconds in spans if seconds > 0]
    _, total, _ = progress_counts(study)
    left = len(plans) - len(settled)
    eta = "-"
    if left == 0:
        eta = "done"
    elif rates and running:
        eta = format_seconds(max(0, left_tokens) / (sum(rates) / len(rates)) / len(running))
    lines = [
        f"sweep {ctx.study_name}: {len(finished)}/{total} trials finished, {len(running)} running, "
        f"{len(waiting)} waiting, {len(failed)} failed (diverged); {len(handed_back)} attempts handed back "
        f"(preempted, interrupted or worker died) and retried",
        f"tokens: {si(done_tokens)} of {si(all_tokens)} done; ETA {eta}"
        + (
            " (at the tokens/s one worker measured, over the workers running now)"
            if eta not in ("-", "done")
            else ""
        ),
    ]
    lines += [f"not read: {line}" for line in unread]
    if running:
        rows = []
        for t in running:
            attrs = t.user_attrs
            beat = attrs.get("heartbeat")
            rows.append(
                [
                    t.number,
                    run_of(t).name,
                    attrs.get("worker_host", "?"),
                    attrs.get("slurm_job", "-"),
                    attrs.get("devices", "-"),
                    f"{now - float(beat):.0f} s ago" if beat else "-",
                ]
            )
        lines.append(markdown_table(["trial", "run", "host", "slurm job", "devices", "heartbeat"], rows))
    return "\n".join(lines)
