"""The Slurm launcher: a sweep's workers as one Slurm job array, submitted through submitit.

Each array task is one `ablate worker` (the same arguments a local worker gets), run in-process by
`run_worker` on the node with this interpreter (submitit starts it there with `-P`:
ablate.core.processes), pulling trials from the sweep's study until none is left. The tasks share nothing but the study and the tracking store,
so the array may be any size and a task may start at any time.

Slurm's warning signal (USR2, `signal_delay_s` before the time limit, or sent by `scancel --signal=USR2`
for a preemption) is caught by `ablate.sweep.preemption`: the running trial saves its checkpoint at its
current step and is handed back to the study, then the task requeues itself (`scontrol requeue`) and its
next start (or any other worker) resumes the trial from that step. A task killed with no warning leaves its
trial RUNNING; the study's liveness rule (`ablate.sweep.queue.is_stale`) retries it.

A worker of several tasks (`tasks_per_node` x `nodes_per_worker`, for DDP trials of that many processes):
srun starts every task; task 0 is the `ablate worker` and the others follow it, training each of its runs
as their Slurm rank (`ablate.train.rank.follow`; Lightning's SLURMEnvironment reads SLURM_NTASKS and
SLURM_PROCID). srun's `--kill-on-bad-exit` ends every task when one fails. The warning signal is not
armed there (a checkpoint in DDP is a step all ranks must take together): a warned or killed multi-task
worker leaves its trial to the liveness rule, which resumes it from its last validation checkpoint.

submitit writes the sbatch script, the job array and the per-task logs (`<workspace>/slurm/`); its own
signal handling and job watching (through `sacct`, which many clusters do not run) are not used: progress
is read from the study, which knows more (`ablate status`).
"""

from __future__ import annotations

import importlib
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ablate.core.errors import UserError
from ablate.core.launcher import SlurmOptions
from ablate.core.processes import child_environment, own_folder, python_command
from ablate.store.study import SweepContext

ENTRY_POINT = "ablate.cli:main"  # what each array task runs: the `ablate` command line, in-process


@dataclass(frozen=True)
class Submitted:
    job_id: str  # the array job's id
    tasks: list[str]  # array_job_task ids, one per worker
    logs: Path


def check_slurm(options: SlurmOptions) -> int:
    """That a Slurm controller answers; returns the number of nodes in the partition the jobs go to."""
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        raise UserError(
            "--launcher: slurm needs Slurm's `sbatch` and `sinfo` on PATH, and they are not here; "
            "run on a Slurm login node, or use --launcher local"
        )
    cmd = ["sinfo", "--noheader", "--format=%n"] + (
        ["--partition", options.partition] if options.partition else []
    )
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        done = None
    if done is None or done.returncode != 0:
        why = (
            "no answer in 60 s"
            if done is None
            else " ".join(done.stderr.split()) or f"exit {done.returncode}"
        )
        raise UserError(
            f"--launcher: slurm: the Slurm controller does not answer (sinfo: {why}); nothing was submitted"
        )
    nodes = set(done.stdout.split())
    if not nodes:
        where = f"partition {options.partition!r}" if options.partition else "the default partition"
        raise UserError(f"--launcher.slurm.partition: {where} has no nodes (sinfo); give another")
    return len(nodes)


def sbatch_extras(options: SlurmOptions) -> dict[str, Any]:
    """`sbatch_lines` (`key=value`, or a bare `key` for a flag; checked by SlurmOptions) as submitit's
    additional parameters."""
    extra: dict[str, Any] = {}
    for line in options.sbatch_lines:
        key, eq, value = line.partition("=")
        extra[key.strip().replace("-", "_")] = value.strip() if eq and value.strip() else True
    return extra


def check_cluster_stores(ctx: SweepContext, nodes: int) -> None:
    """Stores that workers on several nodes cannot share are refused before anything is submitted."""
    if nodes < 2:
        return  # one node: its workers share the workspace's files like local workers do
    uri = ctx.stores.tracking_uri or ""
    if not uri or uri.startswith("sqlite:"):
        raise UserError(
            f"--tracking-uri: workers on {nodes} nodes cannot share a SQLite tracking store "
            f"({uri or 'the default one in the workspace'}: SQLite's file locks do not hold over a network "
            "filesystem); start `ablate server` and pass its http:// URI, or a postgresql:// database"
        )
    if (ctx.stores.storage_url or "").startswith("sqlite:"):
        raise UserError(
            f"--storage: workers on {nodes} nodes cannot share a SQLite study ({ctx.stores.storage_url}); use "
            "journal:/shared/path/optuna.journal (a shared filesystem) or postgresql://..."
        )


def check_tasks(ctx: SweepContext, options: SlurmOptions) -> None:
    """Each worker job's tasks are one trial's DDP processes: every run must ask for as many (Lightning
    checks devices against --ntasks-per-node and num_nodes against --nodes)."""
    if tasks_of(options) == 1:
        return
    for run in ctx.runs.values():
        cfg = run.train
        if (cfg.devices, cfg.num_nodes) != (options.tasks_per_node, options.nodes_per_worker):
            raise UserError(
                f"launcher.slurm.tasks_per_node: {options.tasks_per_node} tasks on each of "
                f"{options.nodes_per_worker} node(s) per worker, but run {run.name} trains on "
                f"train.devices {cfg.devices} x train.num_nodes {cfg.num_nodes}; set them alike (each task "
                "is one DDP process of a trial)"
            )


def submit_workers(ctx: SweepContext, workers: int, options: SlurmOptions, argv: list[str]) -> Submitted:
    """Submit `workers` array tasks, each running the command line's entry point (`ENTRY_POINT`, named,
    not imported: this layer is below it) with an `ablate worker` command line."""
    import submitit

    folder = ctx.stores.workspace.slurm
    # The node's interpreter with `-P` (ablate.core.processes): no module of the submitting folder in place
    # of ablate's; the folder a `python -m ablate.cli` parent imports from is handed down like PYTHONPATH.
    python = shlex.join(python_command())
    executor = submitit.SlurmExecutor(folder=folder / "%A", max_num_timeout=1000, python=python)
    extra = sbatch_extras(options)
    handed = [f"export PYTHONPATH={shlex.quote(child_environment()['PYTHONPATH'])}"] if own_folder() else []
    parameters: dict[str, Any] = dict(
        job_name=f"ablate-{ctx.study_name}",
        time=options.time_min,
        cpus_per_task=options.cpus_per_worker,
        ntasks_per_node=options.tasks_per_node,
        nodes=options.nodes_per_worker,
        signal_delay_s=options.signal_delay_s,
        array_parallelism=options.array_parallelism or workers,
        setup=[f"export OMP_NUM_THREADS={options.cpus_per_worker}", *handed],
        additional_parameters={"requeue": True, **extra},
    )
    if options.gpus_per_worker:
        parameters["gpus_per_node"] = options.gpus_per_worker
    if tasks_of(options) > 1:
        parameters["srun_args"] = ["--kill-on-bad-exit=1"]
    for name in ("partition", "account", "qos"):
        if getattr(options, name):
            parameters[name] = getattr(options, name)
    if options.mem_gb:
        parameters["mem"] = f"{options.mem_gb}GB"
    executor.update_parameters(**parameters)
    try:
        jobs = executor.map_array(SlurmWorker(ENTRY_POINT, list(argv), str(folder / "ranks")), range(workers))
    except Exception as e:  # sbatch refused (unknown partition, account, option): the user's to fix
        raise UserError(
            f"--launcher: slurm: sbatch refused the job array: {' '.join(str(e).split())[:400]}"
        ) from None
    tasks = [job.job_id for job in jobs]
    return Submitted(job_id=tasks[0].split("_")[0], tasks=tasks, logs=folder / tasks[0].split("_")[0])


@dataclass(frozen=True)
class SlurmWorker:
    """One array task, pickled by submitit and called on the node with the task's index: `ablate worker`,
    requeued when Slurm warns (ablate.sweep.preemption)."""

    entry_point: str  # "module:function", called with the argv
    argv: list[str]
    ranks: str | None = None  # where task 0 of a multi-task worker hands its runs to the other tasks

    def __call__(self, index: int) -> int:
        module, function = self.entry_point.split(":")
        return run_worker(getattr(importlib.import_module(module), function), self.argv, self.ranks)


def tasks_of(options: SlurmOptions) -> int:
    return options.tasks_per_node * options.nodes_per_worker


def run_worker(main: Callable[[list[str]], int], argv: list[str], ranks: str | None = None) -> int:
    from ablate.sweep import preemption
    from ablate.train.launch import RANK_SPECS, publish_spec

    if int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1 and ranks:
        # One folder per start of this task (a requeued task starts again under the same job id).
        run = f"{os.environ.get('SLURM_JOB_ID', '0')}-{os.environ.get('SLURM_RESTART_COUNT', '0') or '0'}"
        folder = Path(ranks) / run
        if int(os.environ.get("SLURM_PROCID", "0")) != 0:
            from ablate.train.rank import follow

            return follow(folder)
        os.environ[RANK_SPECS] = str(folder)
        try:
            code = main(argv)
        finally:
            publish_spec(folder, None)  # the followers stop
        if code:
            raise SystemExit(code)
        return code
    preemption.arm()
    try:
        code = main(argv)
    except preemption.Preempted as e:
        job = os.environ.get("SLURM_ARRAY_JOB_ID", os.environ.get("SLURM_JOB_ID", ""))
        task = os.environ.get("SLURM_ARRAY_TASK_ID")
        job_id = f"{job}_{task}" if task else job
        print(f"[worker] {e}; requeueing Slurm job {job_id}", flush=True)
        subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=120)
        sys.exit(0)  # Slurm starts this task again; the study has the trial, the run its checkpoint
    if code:
        raise SystemExit(code)
    return code


def start(
    ctx: SweepContext,
    workers: int,
    *,
    overrides_argv: list[str],
    wait: bool = False,
    after_trial: Any = None,
) -> Callable[[Any, Any], bool]:
    """Check Slurm and the stores now; return what submits the worker array for a study (and, with
    `wait`, waits for its trials: True when they all finished, for the caller to report). Each array task
    builds its own `after_trial` from the recipe, as every `ablate worker` does."""
    options = ctx.recipe.file.launcher.slurm
    sbatch_extras(options)  # a malformed line is refused now, before anything is enqueued
    check_tasks(ctx, options)
    check_cluster_stores(ctx, check_slurm(options))

    def submit(study: Any, storage: Any = None) -> bool:
        from ablate.sweep.worker import worker_argv

        ctx.stores.workspace.create()  # one line now, not in every array task's log
        argv, env = worker_argv(ctx, overrides_argv)
        os.environ.update(env)  # sbatch exports this environment to the tasks: a password travels there
        done = submit_workers(ctx, workers, options, argv)
        print(
            f"[sweep {ctx.study_name}] submitted Slurm job array {done.job_id} ({workers} workers: "
            f"{', '.join(done.tasks)}); follow it with `squeue -j {done.job_id}` and `ablate status` "
            f"with this command's arguments; logs in {done.logs}; stop it with `scancel {done.job_id}` "
            "(running trials resume from their checkpoints when a sweep or worker is started again)",
            flush=True,
        )
        return wait and wait_for_jobs(ctx, study, done)

    return submit


def wait_for_jobs(ctx: SweepContext, study: Any, submitted: Submitted, poll_s: float = 5.0) -> bool:
    """Print progress until every trial is finished; a UserError if the jobs end before that."""
    import time

    from ablate.store.study import progress_counts

    last = None
    while True:
        # Whether the jobs had ended is read before the trials are counted: jobs that end between the two
        # (the last trial told, then the workers gone) are not taken for jobs that ended early.
        queued = subprocess.run(
            ["squeue", "--noheader", "--format=%i", "--jobs", submitted.job_id],
            capture_output=True,
            text=True,
            timeout=120,
        )
        done, total, _ = progress_counts(study)
        if (done, total) != last:
            print(f"[sweep {ctx.study_name}] {done}/{total} trials finished", flush=True)
            last = (done, total)
        if done >= total:
            return True
        if queued.returncode == 0 and not queued.stdout.strip():
            raise UserError(
                f"--wait: the Slurm jobs of array {submitted.job_id} ended with {total - done} trials "
                f"unfinished; see {submitted.logs}, then run the sweep again to resume them"
            )
        time.sleep(poll_s)
