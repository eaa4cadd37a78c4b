"""The recipe's `launcher:` section: where a sweep's workers run (this machine, or Slurm) and, for Slurm,
the one typed group of options every worker job gets (`ablate.sweep.slurm` submits them).

A recipe sets them once (`launcher: {slurm: {partition: gpu, time_min: 240, gpus_per_worker: 1}}`); the
command line overrides any of them like any recipe key (`--launcher.slurm.partition gpu`).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from jsonargparse.typing import NonNegativeInt, PositiveInt

from ablate.core.errors import UserError


@dataclass(frozen=True)
class SlurmOptions:
    """The Slurm options of every worker job (one array task per worker).

    Attributes:
        partition: partition to submit to (default: the cluster's default partition)
        time_min: time limit of each worker job, in minutes; a job out of time is requeued and goes on
        gpus_per_worker: GPUs each worker job gets on each of its nodes (a trial asking for several devices,
            DDP, needs as many)
        tasks_per_node: processes each worker job runs on each of its nodes (`--ntasks-per-node`): 1, or
            one per device of a DDP trial (its `train.devices`). Task 0 claims the trials; every task trains
            each of them as one DDP rank, placed by Slurm (Lightning's SLURMEnvironment)
        nodes_per_worker: nodes of each worker job (`--nodes`): a trial's `train.num_nodes`
        cpus_per_worker: CPU cores each worker job gets
        mem_gb: memory of each worker job in GB (default: the partition's)
        account: account to charge
        qos: quality of service
        array_parallelism: worker jobs running at once (default: all of them)
        signal_delay_s: seconds before the time limit that Slurm sends the warning signal (USR2), for the
            worker to checkpoint its trial and requeue itself
        sbatch_lines: more sbatch options, each as `key=value` (e.g. `constraint=a100`, `exclusive=`)
    """

    partition: str | None = None
    time_min: PositiveInt = 60
    gpus_per_worker: NonNegativeInt = 0
    tasks_per_node: PositiveInt = 1
    nodes_per_worker: PositiveInt = 1
    cpus_per_worker: PositiveInt = 1
    mem_gb: PositiveInt | None = None
    account: str | None = None
    qos: str | None = None
    array_parallelism: PositiveInt | None = None
    signal_delay_s: PositiveInt = 120
    sbatch_lines: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        for key in ("partition", "account", "qos"):
            one_line(f"launcher.slurm.{key}", getattr(self, key))
        for i, line in enumerate(self.sbatch_lines):
            one_line(f"launcher.slurm.sbatch_lines[{i}]", line)
            name = str(line).partition("=")[0].strip()
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", name):
                raise UserError(
                    f"launcher.slurm.sbatch_lines: {line!r} is not key=value; write sbatch's long option without "
                    "its dashes (constraint=a100, exclusive)"
                )


def one_line(key: str, value: str | None) -> None:
    """One line naming `key` when `value` holds a newline or another control character: each Slurm option
    becomes a line of the batch script, and a newline would end it and start a shell line of its own."""
    if value is not None and any(ord(c) < 32 or ord(c) == 127 for c in str(value)):
        raise UserError(
            f"{key}: {value!r} holds a newline or another control character; an sbatch option is one line "
            "of printable characters"
        )


@dataclass(frozen=True)
class LauncherConfig:
    """The recipe's `launcher:` section.

    Attributes:
        name: where `ablate sweep` and `ablate worker` run the workers (`--launcher` overrides it)
        slurm: options of the Slurm worker jobs
    """

    name: str = "local"  # a name of ablate.sweep.launchers.LAUNCHERS, checked when a sweep starts its workers
    slurm: SlurmOptions = dataclasses.field(default_factory=SlurmOptions)
