"""The warning signal in a real Lightning run: the checkpoint is saved after the step the signal came in,
training stops before the next, and the resumed run goes on from that step (each step logged once) to
the same numbers as a run never interrupted (float32 on CPU: bitwise)."""

from __future__ import annotations

import os

import lightning as L
import pytest
import torch
from mini_project import write_recipe

from ablate.core.workspace import Workspace
from ablate.recipe.loading import load_recipe
from ablate.store.stores import Stores
from ablate.sweep import preemption
from ablate.train.resume import run_dir
from ablate.train.run import train_run

pytestmark = pytest.mark.slow


class WarnAt(L.Callback):
    """Sends this process the warning signal, as Slurm would, once optimizer step `step` is done."""

    def __init__(self, step: int):
        self.step, self.sent = step, False

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step and not self.sent:
            self.sent = True
            os.kill(os.getpid(), preemption.WARNING_SIGNAL)


def test_a_warned_run_checkpoints_at_its_step_and_resumes_to_the_same_numbers(tmp_path):
    recipe = write_recipe(
        tmp_path, base__train__steps=12, base__train__val_every=5, base__train__micro_batch_size=2
    )
    (run,) = [r for r in load_recipe(recipe, []).runs if r.variant == "diff"]
    assert run.train.accumulate == 4  # steps of several micro-batches: saved only once a step is whole
    warned_ws, fresh_ws = tmp_path / "warned", tmp_path / "fresh"
    saved = []
    preemption.arm()
    try:
        with pytest.raises(preemption.Preempted) as stopped:
            train_run(
                run,
                Stores(warned_ws),
                progress=False,
                callbacks=[WarnAt(7), preemption.CheckpointOnWarning(saved.append)],
            )
    finally:
        preemption.disarm()
    assert stopped.value.step == 7 and saved == [7]
    last = run_dir(Workspace(warned_ws), run) / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 7  # not the val at 5

    resumed = train_run(run, Stores(warned_ws), progress=False)
    fresh = train_run(run, Stores(fresh_ws), progress=False)
    assert resumed.steps == fresh.steps == 12
    assert resumed.val_loss == fresh.val_loss
    client = Stores(warned_ws).client()
    steps = sorted(m.step for m in client.get_metric_history(resumed.run_id, "train/loss"))
    assert steps == list(range(1, 13))  # went on from step 7: none twice, none missing
