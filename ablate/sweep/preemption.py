"""A worker's warning signal: save the running trial's checkpoint at its current step, then stop.

Slurm sends a job a warning signal before its time limit or a preemption (`sbatch --signal=USR2@120`,
`scancel --signal=USR2`). A worker under Slurm (`ablate.sweep.slurm`) arms `SIGUSR2` here; the handler
only sets a flag, because it runs between two bytecodes of whatever the main thread does, in the middle
of an optimizer step perhaps. The `CheckpointOnWarning` callback looks at the flag after every optimizer
step, writes the run's resume checkpoint (`checkpoints/last.ckpt`, the file a retried trial resumes from)
at that step and raises `Preempted`; the worker hands its trial back to the study and requeues its job.
The retry continues the same MLflow run from that step.

Why not submitit's own handler (`Checkpointable.checkpoint`, which it calls inside the signal handler and
then exits): the training state is consistent only between optimizer steps, which the handler cannot wait
for. Why not Lightning's (`SLURMEnvironment(auto_requeue=True)`, on SIGUSR1): it requeues the job but
knows nothing of the study, whose trial would stay RUNNING until its heartbeat ran out. One owner: this.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import lightning as L

from ablate.train import checkpoint_files

WARNING_SIGNAL = signal.SIGUSR2  # submitit's default (`--signal=USR2@<signal_delay_s>`)
_warned = threading.Event()
_armed = False


class Preempted(Exception):
    """The worker was warned: the trial's checkpoint is saved at `step` (None: between trials)."""

    def __init__(self, step: int | None):
        super().__init__(
            "warned by the scheduler" + (f"; checkpoint at step {step}" if step is not None else "")
        )
        self.step = step


def arm() -> None:
    """Catch the warning signal from now on (in the main thread: Python runs handlers there)."""
    global _armed
    _warned.clear()
    signal.signal(WARNING_SIGNAL, lambda signum, frame: _warned.set())
    _armed = True


def disarm() -> None:
    """The warning signal's default action again (it ends the process), the flag cleared."""
    global _armed
    signal.signal(WARNING_SIGNAL, signal.SIG_DFL)
    _warned.clear()
    _armed = False


def armed() -> bool:
    return _armed


def stop_if_warned() -> None:
    """Between trials: a warned worker takes no new trial."""
    if _warned.is_set():
        raise Preempted(None)


class CheckpointOnWarning(L.Callback):
    """If warned: after the optimizer step, save the resume checkpoint at that step; then, before the next
    batch trains (the module has logged the step by then: its hooks run after the callbacks'), raise
    `Preempted`. A warning at the last step lets the run finish instead."""

    def __init__(self, on_save: Any = None):
        self.on_save = on_save  # called with the step, once saved (the trial records it)
        self.saved_at: int | None = None

    def on_train_start(self, trainer: L.Trainer, module: Any) -> None:
        self.saved_at = None  # each fit of the trial (a budget's branch too) saves its own checkpoint

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int):
        if (
            not _warned.is_set()
            or self.saved_at is not None
            or (batch_idx + 1) % trainer.accumulate_grad_batches
        ):
            return  # not warned, saved already, or inside an accumulation: the step is not done yet
        folder = Path(trainer.checkpoint_callback.dirpath)
        # whole or not at all (a file, or fsdp's sharded folder): a kill now leaves the old or the new
        checkpoint_files.save(trainer, folder / "last.ckpt")
        self.saved_at = trainer.global_step
        if self.on_save is not None:
            self.on_save(self.saved_at)

    def on_train_batch_start(self, trainer: L.Trainer, module: Any, batch: Any, batch_idx: int):
        if self.saved_at is not None:
            raise Preempted(self.saved_at)
