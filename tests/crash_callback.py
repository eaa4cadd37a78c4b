"""A Lightning callback that stands in for a crash (or a kill) in the middle of training, shared by the
e2e tests that resume after one (pytest puts tests/ on the path, pyproject's `pythonpath`)."""

from __future__ import annotations

import lightning.pytorch as L


class CrashAt(L.Callback):
    """Raises RuntimeError("simulated crash") as the batch of global step `step` starts."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError("simulated crash")
