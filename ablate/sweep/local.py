"""`--launcher local`: a sweep's workers on this machine, as `ablate worker` processes (one GPU set each).

With one worker the sweep's own process trains (`ablate.sweep.worker.work`); with N it starts N
`ablate worker` processes on the same study, their output in the workspace's `logs/`, each given its own
devices (`CUDA_VISIBLE_DEVICES`) on a machine with GPUs, and waits for them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

from ablate.core.errors import UserError
from ablate.core.processes import child_environment, python_command
from ablate.store.study import SweepContext, progress_counts
from ablate.sweep.worker import AfterTrial, work, worker_argv


def start(
    ctx: SweepContext,
    workers: int,
    *,
    overrides_argv: list[str],
    wait: bool = False,
    after_trial: AfterTrial | None = None,
):
    """What trains a study's waiting trials here: True once they are all settled (ablate.sweep.launchers)."""
    if wait:
        raise UserError("--wait: waits for Slurm jobs; use it with --launcher slurm")
    if workers > 1:
        worker_devices(workers, devices_per_run(ctx), visible_gpus())  # too few GPUs: said before enqueuing

    def run(study: Any, storage: Any) -> bool:
        if workers > 1:
            wait_for_workers(ctx, study, spawn_workers(ctx, workers, overrides_argv))
        else:
            work(ctx, study, storage, after_trial=after_trial)
        return True

    return run


# --- local worker processes ----------------------------------------------------------------------------
def spawn_workers(ctx: SweepContext, n: int, overrides_argv: list[str]) -> list[subprocess.Popen]:
    """Start `n` `ablate worker` processes on this machine; their output goes to the workspace's logs/."""
    logs = ctx.stores.workspace.create().logs
    logs.mkdir(exist_ok=True)
    # The cores are shared out: n workers of all-core thread pools oversubscribe the CPU (measured on 2
    # cores under load: 2 threads per process ran ~4x slower than 1). A user's own setting is kept.
    argv, env = worker_argv(ctx, overrides_argv)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
    cmd = python_command("-m", "ablate.cli", *argv)  # no module of the current folder in place of ablate's
    env = child_environment(env)
    procs = []
    for i, devices in enumerate(worker_devices(n, devices_per_run(ctx), visible_gpus())):
        log = open(logs / f"{ctx.study_name}-worker{i}.log", "ab")  # noqa: SIM115 (closed with the process)
        own = env if devices is None else {**env, "CUDA_VISIBLE_DEVICES": devices}
        procs.append(
            subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=own)
        )
    return procs


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
        logs = ctx.stores.workspace.create().logs
        raise UserError(f"--workers: {len(bad)} worker(s) exited with {bad}; see {logs}")
