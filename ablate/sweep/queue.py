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

import math
import os
import socket
import threading
import time
from typing import Any

from ablate.core.processes import pid_alive
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
    beat = attrs.get("heartbeat") or (trial.datetime_start.timestamp() if trial.datetime_start else None)
    return worker_gone(attrs.get("worker_host"), attrs.get("worker_pid"), beat, grace_period, now)


def worker_gone(host: Any, pid: Any, beat: Any, grace_period: float, now: float | None = None) -> bool:
    """Is the process `pid` on `host`, last heard of at `beat` (a timestamp), gone? On this host its pid
    says so; elsewhere a heartbeat older than `grace_period` seconds."""
    return gone_reason(host, pid, beat, grace_period, now) is not None


def gone_reason(host: Any, pid: Any, beat: Any, grace_period: float, now: float | None = None) -> str | None:
    """Why the process `pid` on `host`, last heard of at `beat`, is gone (the rule of `worker_gone`, said
    as what decided it), or None while it may be alive."""
    if host == socket.gethostname() and pid and not pid_alive(int(pid)):
        return f"process {pid} on this host has ended"
    if beat is not None and (silent := (now or time.time()) - float(beat)) > grace_period:
        return f"no heartbeat for {silent:.0f} s, over the grace period of {grace_period:g} s"
    return None


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
    enqueue_retry(study, frozen)
    return True


def enqueue_retry(study: Any, frozen: Any) -> None:
    """A WAITING trial with `frozen`'s parameters and plan, marked as its retry."""
    study.enqueue_trial(
        dict(frozen.params),
        user_attrs={"plan": frozen.user_attrs.get("plan"), "retry_of": frozen.number},
        skip_if_exists=False,
    )


def hand_back(study: Any, storage: Any, frozen: Any, reason: str) -> None:
    """The worker of a RUNNING trial gives it up (a warning signal, Ctrl-C, a bug): its retry is enqueued
    before the trial is failed, so no other worker ever sees the plan neither waiting nor running (and
    exits, or loses it to a kill between the two steps). Only the trial's own worker calls this; another
    worker that finds the trial stale takes `fail_and_requeue`'s atomic step instead."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    enqueue_retry(study, frozen)
    try:
        tid = trial_id(study, storage, frozen.number)
        storage.set_trial_user_attr(tid, "failure_reason", reason)
        storage.set_trial_state_values(tid, state=TrialState.FAIL)
    except UpdateFinishedTrialError:  # failed as stale by another worker, which enqueued a retry too
        withdraw_one_retry(study, storage, frozen.number)


def withdraw_one_retry(study: Any, storage: Any, number: int) -> None:
    """Of two retries enqueued for trial `number`, take one still waiting out of the queue (claimed, then
    failed as a duplicate), so the plan trains once."""
    from optuna.trial import TrialState

    for waiting in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if waiting.user_attrs.get("retry_of") != number:
            continue
        tid = trial_id(study, storage, waiting.number)
        if storage.set_trial_state_values(tid, state=TrialState.RUNNING):
            storage.set_trial_user_attr(tid, "failure_reason", f"a second retry of trial {number}")
            storage.set_trial_state_values(tid, state=TrialState.FAIL)
            return


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


class TrialTakenOver(Exception):
    """This worker's trial was failed and handed to another worker (its heartbeat was older than the grace
    period: the worker was paused, or cut off from the storage); it stops training it (ablate.sweep.worker)."""


class Heartbeat:
    """Writes host, pid and a timestamp into a running trial every `interval` seconds, and notices when the
    trial is no longer this worker's: another worker failed it as stale and enqueued its retry (`lost` then
    says why, and the worker loop stops training it at the next step), or no heartbeat could be written for
    longer than `grace_period` (another worker may have taken it)."""

    def __init__(
        self, trial: Any, storage: Any, grace_period: float = math.inf, interval: float | None = None
    ):
        self.trial, self.storage, self.grace_period = trial, storage, grace_period
        self.interval = HEARTBEAT_SECONDS if interval is None else interval
        self.trial_id = trial_id(trial.study, storage, trial.number)
        self.lost: str | None = None
        self._stop = threading.Event()
        self.owner = {"worker_host": socket.gethostname(), "worker_pid": os.getpid()}
        for attr, value in {**self.owner, **placement()}.items():  # `ablate status` shows where it runs
            trial.set_user_attr(attr, value)
        trial.set_user_attr("heartbeat", time.time())
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        from optuna.exceptions import UpdateFinishedTrialError

        written, said = time.time(), False
        while not self._stop.wait(self.interval):
            try:
                self.lost = self._taken()
                if self.lost is None:
                    self.trial.set_user_attr("heartbeat", time.time())
                    written = time.time()
                    continue
            except UpdateFinishedTrialError:  # finished between the look and the write
                self.lost = f"trial {self.trial.number} was finished by another process"
            except Exception as e:  # noqa: BLE001 - the storage is unreachable (a database, a file system)
                silent = time.time() - written
                error = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
                if silent <= self.grace_period:
                    if not said:
                        print(f"[sweep] trial {self.trial.number}: heartbeat not written ({error}); retrying")
                        said = True
                    continue
                self.lost = (
                    f"no heartbeat written for {silent:.0f} s ({error}), longer than the grace period of "
                    f"{self.grace_period:g} s: another worker may have taken trial {self.trial.number} over"
                )
            return

    def _taken(self) -> str | None:
        """Why the trial is no longer this worker's, or None while it is."""
        from optuna.trial import TrialState

        frozen = self.storage.get_trial(self.trial_id)
        if frozen.state != TrialState.RUNNING:
            reason = frozen.user_attrs.get("failure_reason")
            return (
                f"trial {frozen.number} is {frozen.state.name}"
                + (f" ({reason})" if reason else "")
                + ": another worker found it stale and enqueued its retry"
            )
        holder = {k: frozen.user_attrs.get(k) for k in self.owner}
        if holder != self.owner:
            return f"trial {frozen.number} is run by host {holder['worker_host']}, pid {holder['worker_pid']}"
        return None

    def check(self) -> None:
        """Raise `TrialTakenOver` once the trial is no longer this worker's."""
        if self.lost is not None:
            raise TrialTakenOver(self.lost)

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
