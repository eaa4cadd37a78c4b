"""`ablate status`: how far a sweep is, read from its study alone (no MLflow, nothing written).

Trials by plan: finished, running (where: host, Slurm job, devices, last heartbeat), waiting and failed
for good (diverged); attempts handed back (preempted, interrupted, worker died) are counted apart, since
their retry is one of the others. Tokens are the finished runs' planned tokens; the ETA is the mean
duration of a finished trial times the unfinished plans, over the workers running now.
"""

from __future__ import annotations

import time
from typing import Any

from ablate.core.tables import format_seconds, markdown_table, si
from ablate.store.study import SweepContext, is_settled, progress_counts, trial_plan


def status_report(ctx: SweepContext, study: Any, now: float | None = None) -> str:
    from optuna.trial import TrialState

    now = time.time() if now is None else now
    trials = study.get_trials(deepcopy=False)
    plans = {t.user_attrs.get("plan") for t in trials}
    settled = {t.user_attrs.get("plan"): t for t in trials if is_settled(t)}
    finished = [t for t in settled.values() if t.state == TrialState.COMPLETE]
    failed = [t for t in settled.values() if t.state == TrialState.FAIL]
    running = [t for t in trials if t.state == TrialState.RUNNING]
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    handed_back = [t for t in trials if t.state == TrialState.FAIL and not is_settled(t)]

    def tokens(trial: Any) -> int:
        run = ctx.run_for_plan(trial_plan(trial))
        return run.train.steps * run.train.batch_tokens

    all_tokens = sum(
        ctx.run_for_plan(p).train.steps * ctx.run_for_plan(p).train.batch_tokens for p in ctx.plans()
    )
    done_tokens = sum(tokens(t) for t in finished)
    _, total, durations = progress_counts(study)
    left = len(plans) - len(settled)
    eta = "-"
    if left == 0:
        eta = "done"
    elif durations and running:
        eta = format_seconds(left * (sum(durations) / len(durations)) / len(running))
    lines = [
        f"sweep {ctx.study_name}: {len(finished)}/{total} trials finished, {len(running)} running, "
        f"{len(waiting)} waiting, {len(failed)} failed (diverged); {len(handed_back)} attempts handed back "
        f"(preempted, interrupted or worker died) and retried",
        f"tokens: {si(done_tokens)} of {si(all_tokens)} done; ETA {eta}"
        + (
            " (at the finished trials' mean duration, over the workers running now)"
            if eta not in ("-", "done")
            else ""
        ),
    ]
    if running:
        rows = []
        for t in running:
            attrs = t.user_attrs
            beat = attrs.get("heartbeat")
            rows.append(
                [
                    t.number,
                    ctx.run_for_plan(trial_plan(t)).name,
                    attrs.get("worker_host", "?"),
                    attrs.get("slurm_job", "-"),
                    attrs.get("devices", "-"),
                    f"{now - float(beat):.0f} s ago" if beat else "-",
                ]
            )
        lines.append(markdown_table(["trial", "run", "host", "slurm job", "devices", "heartbeat"], rows))
    return "\n".join(lines)
