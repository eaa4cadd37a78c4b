"""The trial queue of a sweep's Optuna study, and the liveness of the workers that take from it.

The grid (variants x sizes x seeds, times a search spec's grid points or sampled trials) is enqueued
once as WAITING trials whose parameters fix the run; workers claim waiting trials one at a time (an
atomic WAITING -> RUNNING transition in the storage, so N workers run each trial exactly once).

Liveness, the same for the journal file and an RDB: a worker writes its host, pid and a heartbeat
timestamp into the trial it runs. A RUNNING trial whose worker is gone (same host and the pid is dead,
or no heartbeat for `grace_period` seconds) is failed and re-enqueued with the same parameters; the
retry resumes the run from its last checkpoint and its MLflow run (same run key), so a run is never
finished twice. Optuna's own heartbeat exists only for RDB storages, hence this.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from ablate.store.study import SweepContext, is_settled, plan_key

HEARTBEAT_SECONDS = 5.0


# --- storage and study ----------------------------------------------------------------------------
def enqueue_missing(study: Any, plans: list[dict[str, Any]]) -> int:
    """Enqueue the plans that have no trial yet (in any state); returns how many were added."""
    have = {t.user_attrs.get("plan") for t in study.get_trials(deepcopy=False)}
    added = 0
    for plan in plans:
        key = plan_key(plan)
        if key not in have:
            # Only searched keys are Optuna parameters (their spaces are the same in every trial);
            # variant, seed and size are the trial's plan, a user attribute.
            searched = {k: v for k, v in plan.items() if k.startswith("base.")}
            study.enqueue_trial(searched, user_attrs={"plan": key}, skip_if_exists=False)
            added += 1
    return added


# --- claiming, liveness, retries ---------------------------------------------------------------------
def trial_id(study: Any, storage: Any, number: int) -> int:
    """The storage's id of trial `number` of `study`, through the storage's public API."""
    return storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name(study.study_name), number
    )


def claim_waiting(study: Any, storage: Any):
    """Atomically take one WAITING trial (WAITING -> RUNNING in the storage), or None.

    `study.ask()` also pops a waiting trial, but creates a new one when none is left (or another worker
    took the last between our look and our ask); a worker here must run only enqueued plans, so it claims
    with the storage's own atomic `set_trial_state_values`, all public Optuna API."""
    import optuna
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    for frozen in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        tid = trial_id(study, storage, frozen.number)
        try:
            if storage.set_trial_state_values(tid, state=TrialState.RUNNING):
                return optuna.trial.Trial(study, tid)
        except UpdateFinishedTrialError:
            continue
    return None


def is_stale(trial: Any, grace_period: float, now: float | None = None) -> bool:
    """Is the worker of this RUNNING trial gone?"""
    attrs = trial.user_attrs
    host, pid = attrs.get("worker_host"), attrs.get("worker_pid")
    if host == socket.gethostname() and pid and not _pid_alive(int(pid)):
        return True
    beat = attrs.get("heartbeat") or (trial.datetime_start.timestamp() if trial.datetime_start else None)
    return beat is not None and (now or time.time()) - float(beat) > grace_period


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child (killed, not yet reaped) still answers kill(0): ask /proc where there is one.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def fail_and_requeue(study: Any, storage: Any, frozen: Any, reason: str) -> bool:
    """Mark a RUNNING trial FAIL and enqueue a retry with the same plan; False if someone else did."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    try:
        # The reason first: a finished trial takes no more attributes. The state change is the atomic
        # step: of several workers that see the same stale trial, one wins and re-enqueues it.
        tid = trial_id(study, storage, frozen.number)
        storage.set_trial_user_attr(tid, "failure_reason", reason)
        if not storage.set_trial_state_values(tid, state=TrialState.FAIL):
            return False
    except UpdateFinishedTrialError:
        return False
    study.enqueue_trial(
        dict(frozen.params),
        user_attrs={"plan": frozen.user_attrs.get("plan"), "retry_of": frozen.number},
        skip_if_exists=False,
    )
    return True


def recover_stale(study: Any, storage: Any, grace_period: float) -> int:
    from optuna.trial import TrialState

    n = 0
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if is_stale(frozen, grace_period) and fail_and_requeue(study, storage, frozen, "worker died"):
            n += 1
    return n


def placement() -> dict[str, str]:
    """This worker's Slurm job (array job_task, as squeue names it) and devices, where there are any."""
    env = os.environ
    job = env.get("SLURM_JOB_ID")
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        job = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    found = {"slurm_job": job, "devices": env.get("CUDA_VISIBLE_DEVICES")}
    return {k: v for k, v in found.items() if v}


class Heartbeat:
    """Writes host, pid and a timestamp into a running trial every few seconds."""

    def __init__(self, trial: Any, interval: float = HEARTBEAT_SECONDS):
        self.trial, self.interval = trial, interval
        self._stop = threading.Event()
        trial.set_user_attr("worker_host", socket.gethostname())
        trial.set_user_attr("worker_pid", os.getpid())
        for attr, value in placement().items():  # `ablate status` shows where a trial runs
            trial.set_user_attr(attr, value)
        trial.set_user_attr("heartbeat", time.time())
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.trial.set_user_attr("heartbeat", time.time())
            except Exception:  # the trial finished meanwhile, or the storage hiccuped: next beat retries
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def pending_plans(
    study: Any, plans: list[dict[str, Any]], ctx: SweepContext | None = None
) -> list[dict[str, Any]]:
    """Plans without a finished trial (complete, pruned, or failed by divergence); with `ctx`, also those
    whose trial ran fewer budgets than the recipe now gives (an extension, ablate.sweep.extend)."""
    from ablate.sweep.extend import budgets_done

    done = {
        t.user_attrs.get("plan")
        for t in study.get_trials(deepcopy=False)
        if is_settled(t) and (ctx is None or budgets_done(t, ctx))
    }
    return [p for p in plans if plan_key(p) not in done]
