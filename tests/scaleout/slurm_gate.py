"""A gate for tests/scaleout/test_slurm.py, imported by its recipe (`imports:`) in every process that loads it.

With `ABLATE_TEST_GATE` set to a folder, a Slurm worker's trial stops after step `STEP` (the warning's
callback, `ablate.sweep.preemption.CheckpointOnWarning`, is only there under Slurm) and waits until its
worker is warned or the test creates `open` in that folder, having written `<slurm job>.waiting` there.
So the test signals and cancels tasks while a trial is mid-run, however fast or slow the machine trains:
it waits for these files, not for time.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ablate.sweep import preemption
from ablate.sweep.queue import placement

STEP = 30
_original = preemption.CheckpointOnWarning.on_train_batch_end


def _waiting_at_the_gate(self, trainer, module, outputs, batch, batch_idx):
    folder = Path(os.environ["ABLATE_TEST_GATE"])
    if trainer.global_step == STEP and not (folder / "open").exists():
        (folder / f"{placement().get('slurm_job', 'local')}.waiting").write_text(str(os.getpid()))
        while not preemption._warned.is_set() and not (folder / "open").exists():
            time.sleep(0.05)  # the warning's handler runs here, in this (the main) thread
    return _original(self, trainer, module, outputs, batch, batch_idx)


if os.environ.get("ABLATE_TEST_GATE"):
    preemption.CheckpointOnWarning.on_train_batch_end = _waiting_at_the_gate
