"""`ablate sweep`: one Optuna study per recipe and scale; every trial one training run.

The grid (variants x sizes x seeds, times a search spec's grid points or sampled trials) is enqueued
once as WAITING trials whose parameters fix the run; workers claim waiting trials one at a time (an
atomic WAITING -> RUNNING transition in the storage, so N workers run each trial exactly once).
A trial's value is the run's final validation loss; its user attributes carry variant, seed, run key
and MLflow run id. MLflow holds one parent run per study and one child run per trial.

Liveness, the same for the journal file and an RDB: a worker writes its host, pid and a heartbeat
timestamp into the trial it runs. A RUNNING trial whose worker is gone (same host and the pid is dead,
or no heartbeat for `grace_period` seconds) is failed and re-enqueued with the same parameters; the
retry resumes the run from its last checkpoint and its MLflow run (same run key), so a run is never
finished twice. Optuna's own heartbeat exists only for RDB storages, hence this.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ablate.core.errors import UserError
from ablate.core.tables import format_seconds, si
from ablate.recipe.resolve import RunSpec
from ablate.recipe.search import point_label
from ablate.store import tracking
from ablate.store.study import (  # noqa: F401 (SweepContext, report_folder... are used through ablate.sweep.run too)
    SweepContext,
    command_line,
    is_settled,
    open_study,
    plan_key,
    progress_counts,
    report_folder,
    trial_plan,
)
from ablate.sweep import preemption

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


class Heartbeat:
    """Writes host, pid and a timestamp into a running trial every few seconds."""

    def __init__(self, trial: Any, interval: float = HEARTBEAT_SECONDS):
        self.trial, self.interval = trial, interval
        self._stop = threading.Event()
        trial.set_user_attr("worker_host", socket.gethostname())
        trial.set_user_attr("worker_pid", os.getpid())
        for attr, value in worker_placement().items():  # `ablate status` shows where a trial runs
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


def worker_placement() -> dict[str, str]:
    """This worker's Slurm job (array job_task, as squeue names it) and devices, where there are any."""
    env = os.environ
    job = env.get("SLURM_JOB_ID")
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        job = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    found = {"slurm_job": job, "devices": env.get("CUDA_VISIBLE_DEVICES")}
    return {k: v for k, v in found.items() if v}


# --- the worker loop -------------------------------------------------------------------------------------
def parent_run_id(ctx: SweepContext, study: Any) -> str:
    """The study's MLflow parent run (created once, remembered in the study)."""
    known = study.user_attrs.get("mlflow_parent_run_id")
    if known:
        return known
    client = ctx.stores.client()
    experiment_id = tracking.get_experiment_id(
        client, tracking.experiment_name(ctx.recipe.name, ctx.scale), ctx.stores.workspace
    )
    found = client.search_runs(
        [experiment_id], filter_string=f"tags.`ablate.store.study` = '{ctx.study_name}'"
    )
    if found:
        run_id = found[0].info.run_id
    else:
        tags = {
            "ablate.study": ctx.study_name,
            "ablate.role": "sweep",
            "ablate.recipe": ctx.recipe.name,
            "ablate.scale": ctx.scale,
            "ablate.code_version": tracking.code_version(),
        }
        run_id = client.create_run(experiment_id, run_name=f"sweep {ctx.study_name}", tags=tags).info.run_id
    study.set_user_attr("mlflow_parent_run_id", run_id)
    return run_id


def work(ctx: SweepContext, study: Any, storage: Any, workers: int = 1) -> int:
    """Run trials until none is waiting or running elsewhere; returns the number this process trained."""
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
            from optuna.trial import TrialState

            if not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                return trained
            time.sleep(1.0)  # others are still running: one of them may die and need a retry
            continue
        run_trial(ctx, study, storage, trial, parent, workers)
        trained += 1


def run_trial(ctx: SweepContext, study: Any, storage: Any, trial: Any, parent: str, workers: int) -> None:
    import optuna

    from ablate.train.branches import train_budgets
    from ablate.train.loop import Diverged
    from ablate.train.pruning import PruningCallback

    plan = trial_plan(trial)
    sampled = {d.key: d.suggest(trial) for d in ctx.search.dimensions}  # enqueued grid points come back fixed
    run = ctx.run_for_plan(plan, sampled)
    heartbeat = Heartbeat(trial)
    try:
        client = ctx.stores.client()
        trial_tags = {"ablate.trial": str(trial.number), "ablate.study": ctx.study_name}
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
        _print_progress(ctx, study, run, workers, sampled)
        callbacks = [PruningCallback(trial)] if ctx.search.pruner.get("name", "none") != "none" else []
        if preemption.armed():
            callbacks.append(
                preemption.CheckpointOnWarning(lambda step: trial.set_user_attr("preempted_at", step))
            )

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
            callbacks=callbacks,
            on_result=record_budget,
        )[0]
    except Diverged as e:
        heartbeat.stop()
        trial.set_user_attr("failure_reason", f"diverged: {e}")
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        print(f"[sweep] {run.name} diverged ({e}); marked failed, going on", flush=True)
        return
    except optuna.TrialPruned as e:
        heartbeat.stop()
        client.set_tag(run_id, "ablate.pruned", str(e))
        client.set_terminated(run_id, status="KILLED")
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return
    except BaseException as e:  # a user error, Ctrl-C or a bug: hand the trial back for the next attempt
        heartbeat.stop()
        reason = (
            f"preempted: {e}" if isinstance(e, preemption.Preempted) else f"interrupted: {type(e).__name__}"
        )
        fail_and_requeue(study, storage, study.get_trials(deepcopy=False)[trial.number], reason)
        raise
    if ctx.recipe.eval(run.scale).after_trial:  # the recipe's eval: probes each run as its trial ends
        from ablate.probes.run import probe_after_trial

        probe_after_trial(ctx.recipe, run, result.run_id, ctx.stores)
    heartbeat.stop()
    study.tell(trial, result.val_loss)
    print(f"[sweep] {result.summary()}", flush=True)


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


# --- local worker processes ----------------------------------------------------------------------------
def spawn_workers(ctx: SweepContext, n: int, overrides_argv: list[str]) -> list[subprocess.Popen]:
    """Start `n` `ablate worker` processes on this machine; their output goes to the workspace's logs/."""
    logs = tracking.ensure_workspace(ctx.stores.workspace) / "logs"
    logs.mkdir(exist_ok=True)
    # The cores are shared out: n workers of all-core thread pools oversubscribe the CPU (measured on 2
    # cores under load: 2 threads per process ran ~4x slower than 1). A user's own setting is kept.
    env = {**os.environ}
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
    cmd = [sys.executable, "-m", "ablate.cli", *worker_argv(ctx, overrides_argv)]
    procs = []
    for i, devices in enumerate(worker_devices(n, devices_per_run(ctx), visible_gpus())):
        log = open(logs / f"{ctx.study_name}-worker{i}.log", "ab")  # noqa: SIM115 (closed with the process)
        own = env if devices is None else {**env, "CUDA_VISIBLE_DEVICES": devices}
        procs.append(
            subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=own)
        )
    return procs


def worker_argv(ctx: SweepContext, overrides_argv: list[str]) -> list[str]:
    """`ablate worker ...` arguments (after `ablate`) that join this sweep's study."""
    stores = ctx.stores
    argv = ["worker", str(ctx.recipe.path), "--scale", ctx.scale, "--storage", stores.optuna_url()]
    argv += ["--workspace", str(stores.workspace), "--seeds", *map(str, ctx.seeds)]
    if stores.tracking_uri:
        argv += ["--tracking-uri", stores.tracking_uri]
    if ctx.search_path:
        argv += ["--search", ctx.search_path]
    return argv + overrides_argv


# --- a device per worker -----------------------------------------------------------------------------------
def gpu_count() -> int:
    """CUDA devices this process sees (0 without CUDA). The one place the sweep asks torch.cuda."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def visible_gpus() -> list[str]:
    """The GPUs workers may be given: the user's CUDA_VISIBLE_DEVICES entries, else 0..count-1."""
    count = gpu_count()
    given = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return given[:count] if given else [str(i) for i in range(count)]


def devices_per_run(ctx: SweepContext) -> int:
    """Devices a trial trains on (the most any run asks for: `train.devices`, several for DDP)."""
    return max((run.train.devices for run in ctx.runs.values()), default=1)


def worker_devices(workers: int, per_worker: int, gpus: list[str]) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES of each local worker: its own `per_worker` GPUs; None for all on a machine
    without GPUs (the workers train on CPU cores). Too few GPUs for every worker is the user's to fix."""
    if not gpus:
        return [None] * workers
    if workers * per_worker > len(gpus):
        raise UserError(
            f"--workers: {workers} workers x {per_worker} device(s) per trial need {workers * per_worker} "
            f"GPUs, this machine has {len(gpus)}; use --workers {max(1, len(gpus) // per_worker)}"
        )
    return [",".join(gpus[i * per_worker : (i + 1) * per_worker]) for i in range(workers)]


def wait_for_workers(ctx: SweepContext, study: Any, procs: list[subprocess.Popen]) -> None:
    last = None
    try:
        while any(p.poll() is None for p in procs):
            done, total, _ = progress_counts(study)
            if (done, total) != last:
                print(
                    f"[sweep {ctx.study_name}] {done}/{total} trials finished, {len(procs)} workers",
                    flush=True,
                )
                last = (done, total)
            time.sleep(2.0)
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGINT)
        for p in procs:
            p.wait()
        raise
    bad = [p.returncode for p in procs if p.returncode not in (0, None)]
    if bad:
        logs = tracking.ensure_workspace(ctx.stores.workspace) / "logs"
        raise UserError(f"--workers: {len(bad)} worker(s) exited with {bad}; see {logs}")


# --- the whole sweep -----------------------------------------------------------------------------------
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


def confirm_plan(ctx: SweepContext, pending: list[dict[str, Any]], yes: bool) -> None:
    from ablate.recipe.data_use import confirm_passes, data_uses
    from ablate.sweep.estimate import make_plan

    runs = [ctx.run_for_plan(p) for p in pending]
    plan = make_plan(runs, ctx.stores.workspace)
    print(
        f"[sweep {ctx.study_name}] plan: {plan.trials} trials, {si(plan.tokens)} tokens, "
        f"{si(plan.train_flops)}FLOP of training; calibrated {si(plan.flops_per_s)}FLOP/s here in "
        f"{plan.precision} ({plan.precision_reason}) "
        f"-> about {format_seconds(plan.seconds)} on one worker",
        flush=True,
    )
    uses = data_uses(runs, ctx.stores.workspace)
    for use in uses:
        print(f"[sweep {ctx.study_name}] {use.line()}", flush=True)
    confirm_passes(uses)  # asked whatever --yes says: repeating the corpus changes the experiment
    if plan.seconds > 3600 and not yes:
        if not sys.stdin or not sys.stdin.isatty():
            raise UserError(
                f"--yes: the sweep is estimated at {format_seconds(plan.seconds)} (over an hour); "
                "pass --yes to start it, or a smaller --scale (e.g. tiny)"
            )
        answer = input(f"Estimated {format_seconds(plan.seconds)}. Start? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            raise UserError("--yes: not confirmed; nothing was started")


def run_sweep(
    ctx: SweepContext,
    *,
    workers: int = 1,
    yes: bool = False,
    reports: Path | None = None,
    overrides_argv: list[str] | None = None,
    train: bool = True,
    final: bool = False,
    submit: Any = None,
) -> Path | None:
    """Plan, enqueue, train (here or in `workers` local processes), then report. Returns the report folder.

    With `train=False` it only enqueues the trials and creates the MLflow parent run: `ablate worker`s on
    other machines train them, and `ablate report` writes the report afterwards. `submit(study)` starts
    workers elsewhere (`ablate.sweep.slurm.launch`): it returns True once they finished every trial. With
    budgets, it says how large the kept stable-phase checkpoints are (an extension continues from them);
    `final` deletes them once the study is complete.
    """
    from ablate.sweep.extend import check_extension, enqueue_extensions

    study, storage = open_study(ctx)
    check_extension(ctx, study)
    plans = ctx.plans()
    pending = pending_plans(study, plans, ctx)
    report_dir = None
    if pending:
        confirm_plan(ctx, pending, yes)
        enqueue_missing(study, plans)
        enqueue_extensions(study, pending)
        study.set_user_attr("recipe_key", ctx.recipe_key())
        if not study.user_attrs.get("command"):  # the report names the command that made the study
            study.set_user_attr("command", command_line())
        parent_run_id(ctx, study)  # creates the MLflow store here, before workers would race to create it
        if submit is not None:
            if not submit(study):
                return None
        elif not train:
            print(
                f"[sweep {ctx.study_name}] {len(pending)} trials enqueued; start `ablate worker` processes "
                "on the training machines, then `ablate report`",
                flush=True,
            )
            return None
        elif workers > 1:
            procs = spawn_workers(ctx, workers, overrides_argv or [])
            wait_for_workers(ctx, study, procs)
        else:
            work(ctx, study, storage)
    remaining = pending_plans(study, plans, ctx)
    if remaining:
        print(
            f"[sweep {ctx.study_name}] {len(remaining)} trials still running elsewhere; "
            "run `ablate report` with the same arguments when they finish",
            flush=True,
        )
        return None
    folder = report_folder(ctx, reports)
    if pending or not (folder / "table.md").exists():
        from ablate.report.write import write_report  # here: enqueuing and training need no report libraries

        report_dir = write_report(ctx, study, folder)
    else:
        print(
            f"[sweep {ctx.study_name}] all {len(plans)} trials were already finished; nothing to do",
            flush=True,
        )
        report_dir = folder
    if ctx.recipe.budgets(ctx.scale) is not None:
        keep_or_prune_stable(ctx, final)
    return report_dir


def keep_or_prune_stable(ctx: SweepContext, final: bool) -> None:
    """Print the size of a budgeted study's kept stable-phase checkpoints, or delete them (`final`)."""
    from ablate.train.branches import prune_stable, stable_size

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
