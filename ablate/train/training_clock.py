"""A run's training time across its attempts: the seconds of earlier attempts travel in its checkpoints.

A run that is killed resumes from its last checkpoint (ablate.train.resume), and the Trainer's clock of the
attempt that finishes it counts only that attempt. `TrainingClock` is a Lightning callback whose state,
saved in every checkpoint, is the run's training seconds so far, so the attempt that resumes from a
checkpoint knows what the earlier ones spent up to it. Time an attempt spent after its last checkpoint is
not counted: the next attempt does that work again, and its time for it is.

The state names the run that saved it (its key). A budget's run starts from a checkpoint that another run
saved (its branch point, ablate.train.branches; a longer budget continuing from a kept stable phase), and
that run's seconds are not its own, so they are left out.
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as L


class TrainingClock(L.Callback):
    """`earlier_seconds`: the training seconds of this run's earlier attempts up to the checkpoint this
    attempt resumed from (0.0 for a run that started at step 0 or from another run's checkpoint)."""

    def __init__(self, run_key: str):
        self.run_key = run_key
        self.earlier_seconds = 0.0
        self._started = time.perf_counter()

    def on_fit_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self._started = time.perf_counter()

    def state_dict(self) -> dict[str, Any]:
        return {"run": self.run_key, "seconds": self.earlier_seconds + time.perf_counter() - self._started}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("run") == self.run_key:
            self.earlier_seconds = float(state["seconds"])
