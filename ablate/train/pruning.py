"""Optuna pruning of one training run: a plain Lightning callback on Optuna's public trial API.

optuna-integration's `PyTorchLightningPruningCallback` reports at `trainer.current_epoch`; a run here is
one long epoch with a validation every `train.val_every` optimizer steps, so its reports would collide on
one step. This callback reports each validation loss at the optimizer step (`trainer.global_step`, i.e.
tokens) with `trial.report` and stops the run when `trial.should_prune()` says so.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as L
import optuna


class PruningCallback(L.Callback):
    """Reports validation loss to an Optuna trial at optimizer steps; raises `optuna.TrialPruned` when told."""

    def __init__(self, trial: optuna.trial.Trial):
        super().__init__()
        self.trial = trial

    def on_validation_end(self, trainer: L.Trainer, module: Any) -> None:
        if trainer.sanity_checking or not module.history:
            return
        step = trainer.global_step
        self.trial.report(module.history[-1]["val/loss"], step=step)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step}")
