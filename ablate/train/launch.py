"""Multi-device runs: one process per local device, started by `train_run` itself (a small torchrun).

A recipe asks for `train: {strategy: ddp, devices: N, num_nodes: M}`. The process that calls `train_run`
is local rank 0 of its node; before Lightning sets up the process group it starts local ranks 1..N-1 as
`python -m ablate.train.rank SPEC` (SPEC: the RunSpec as JSON, in the run folder) and tells Lightning that
the processes exist (a cluster environment that `creates_processes_externally`).

Why not Lightning's own launchers: `ddp` re-runs the command line (`sys.argv`) once per device, which
in a sweep worker claims other trials and under pytest re-runs the tests; `ddp_spawn`/`ddp_fork`
pickle or fork the module and give the caller back neither its history nor its step count.
So those are refused (ablate.train.config.SPAWNING_STRATEGIES); `auto` with several devices means `ddp`.

Multi-node: run the same `ablate train` command on every node with MASTER_ADDR, MASTER_PORT and NODE_RANK
set (Lightning's convention). Global rank 0 (node 0, local rank 0) is the only process that writes to
MLflow and result files. Processes started by torchrun (LOCAL_RANK / RANK set) or by SLURM's srun are
taken as they are: nothing is spawned, Lightning reads their environment.

A sweep worker that is several Slurm tasks (`launcher.slurm.tasks_per_node`, `nodes_per_worker`) has its
task 0 claim the trials; the others follow it (`ablate.train.rank.follow`): before each training task 0
writes the run as the next numbered spec in the folder `RANK_SPECS` names (`0.json`, `1.json`, ...; a
`done` spec when the worker stops), and each follower trains it as its Slurm rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ablate.core.errors import UserError
from ablate.core.processes import child_environment, python_command
from ablate.core.workspace import Workspace

RANK_SPECS = "ABLATE_RANK_SPECS"  # the folder where a Slurm worker's task 0 hands its runs to the others


def world_size(cfg: Any) -> int:
    return cfg.devices * cfg.num_nodes


def launched_externally() -> bool:
    """Did torchrun, srun or the user start every rank (so we must not spawn any)?"""
    env = os.environ
    return "LOCAL_RANK" in env or "RANK" in env or int(env.get("SLURM_NTASKS", "1") or 1) > 1


def node_rank() -> int:
    return int(os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", 0)))


def global_rank(cfg: Any) -> int:
    """This process's rank among all devices of all nodes (0 when training on one device)."""
    if world_size(cfg) == 1:
        return 0
    env = os.environ
    if "RANK" in env:
        return int(env["RANK"])
    if "SLURM_PROCID" in env and launched_externally():
        return int(env["SLURM_PROCID"])
    return node_rank() * cfg.devices + int(env.get("LOCAL_RANK", 0))


def strategy_for(cfg: Any) -> str:
    """The Lightning strategy name (TrainConfig already refused SPAWNING_STRATEGIES)."""
    return "ddp" if cfg.strategy == "auto" and world_size(cfg) > 1 else cfg.strategy


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environment(address: str, port: int, node: int) -> Any:
    """Lightning's default environment, told that local rank 0 is this process and the others exist."""
    from lightning.fabric.plugins.environments import LightningEnvironment

    class SpawnedByAblate(LightningEnvironment):
        @property
        def creates_processes_externally(self) -> bool:
            return True

        @property
        def main_address(self) -> str:
            return address

        @property
        def main_port(self) -> int:
            return port

        def local_rank(self) -> int:
            return 0

        def node_rank(self) -> int:
            return node

    return SpawnedByAblate()


@contextlib.contextmanager
def local_ranks(run: Any, workspace: Workspace, folder: Path) -> Iterator[list[Any]]:
    """Around Trainer creation and fit in the calling process: start the other local ranks, yield the
    Trainer plugins to pass, and on the way out tear down the process group and reap the ranks."""
    cfg = run.train
    if world_size(cfg) == 1 or launched_externally():
        if world_size(cfg) > 1 and os.environ.get(RANK_SPECS) and global_rank(cfg) == 0:
            publish_spec(Path(os.environ[RANK_SPECS]), run.to_json(), workspace)
        try:
            yield []
        finally:
            if world_size(cfg) == 1:  # fsdp on one device set up a group of one: the next run needs a new one
                _destroy_process_group()
        return
    if cfg.num_nodes > 1:
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK") if k not in os.environ]
        if missing:
            raise UserError(
                f"train.num_nodes: {cfg.num_nodes} nodes need {', '.join(missing)} set on every node "
                "(MASTER_ADDR/MASTER_PORT of node 0, NODE_RANK 0..num_nodes-1)"
            )
        address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    else:
        address, port = "127.0.0.1", free_port()
    node = node_rank()
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "launch.json"  # one per run folder: a resumed run overwrites the one a killed run left
    spec.write_text(json.dumps({"run": run.to_json(), "workspace": str(workspace)}))
    env = {
        **os.environ,
        "MASTER_ADDR": address,
        "MASTER_PORT": str(port),
        "NODE_RANK": str(node),
        "WORLD_SIZE": str(world_size(cfg)),
    }
    procs = [
        subprocess.Popen(
            python_command("-m", "ablate.train.rank", str(spec)),
            env=child_environment({**env, "LOCAL_RANK": str(i)}),
        )
        for i in range(1, cfg.devices)
    ]
    failed = True
    try:
        yield [_environment(address, port, node)]
        failed = False
    finally:
        _destroy_process_group()  # Lightning leaves it up; the next trial of a worker needs a new one
        codes = _reap(procs, kill=failed)
        spec.unlink(missing_ok=True)
    if any(codes):
        raise RuntimeError(f"local ranks 1..{cfg.devices - 1} exited with codes {codes}")


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def publish_spec(folder: Path, run: dict[str, Any] | None, workspace: Workspace | None = None) -> Path:
    """Task 0 of a multi-task worker: the next numbered spec for the followers (`run` None: stop), written
    to a temporary name and renamed, so a follower never reads half a file."""
    folder.mkdir(parents=True, exist_ok=True)
    n = len(list(folder.glob("*.json")))
    spec = {"done": True} if run is None else {"run": run, "workspace": str(workspace)}
    partial = folder / f"{n}.json.partial"
    partial.write_text(json.dumps(spec))
    return partial.replace(folder / f"{n}.json")


def _reap(procs: list[subprocess.Popen], kill: bool, timeout: float = 60.0) -> list[int]:
    if kill:
        for p in procs:
            if p.poll() is None:
                p.kill()
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return [p.returncode for p in procs]


def exit_with_parent() -> None:
    """A rank whose launching process died (SIGKILL) must not linger: watch the parent pid."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()
