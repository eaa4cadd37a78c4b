"""Every token budget of a run from one training: the longest run, and a cooldown branch per smaller budget.

A run with budgets (ablate.recipe.budgets; `train.schedule: wsd`) trains once to its largest budget. Its lr
before a budget's cooldown start does not depend on the run's length (Hägele et al. 2024, arXiv
2405.18392), so its state at that step (weights, AdamW moments, step, data position) is the state a
fresh run of that budget has there. `BranchPoints` saves it, as the budget's own run's `last.ckpt`; the
budget's run then resumes from it like any interrupted run and trains only its cooldown. The budget's run
is an ordinary run (its own key, MLflow run, result.json) tagged with its budget and the run it branched
from, so tables, `ablate fit` and `ablate eval` read it as any other.

Resuming: the longest run resumes from its own checkpoint; a branch point saved before a kill is kept (a
later pass over the same step would save the same state); a finished budget is not trained again
(train_run returns it as already finished). A branch with no checkpoint (deleted) trains from step 0: a
fresh run of its budget, the same numbers at the full price.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning.pytorch as L

from ablate.recipe.resolve import RunSpec
from ablate.train.loop import TrainResult, run_dir, train_run


class BranchPoints(L.Callback):
    """Saves a resumable checkpoint when training finishes optimizer step `step`, for each step given.

    Saved after the optimizer and lr-scheduler steps (Lightning's on_train_batch_end, as ModelCheckpoint's
    every_n_train_steps), written to a temporary name and renamed, so a kill never leaves half a file."""

    def __init__(self, paths: dict[int, Path]):
        self.paths = dict(paths)

    def on_train_batch_end(
        self, trainer: L.Trainer, module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # mid-accumulation: the step has not happened yet
        path = self.paths.get(trainer.global_step)
        if path is None or path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        trainer.save_checkpoint(partial, weights_only=False)
        if trainer.is_global_zero:
            os.replace(partial, path)


def branch_checkpoint(workspace: Path, branch: RunSpec) -> Path:
    """Where a budget's run finds the state it starts its cooldown from: its own resume checkpoint."""
    return run_dir(workspace, branch) / "checkpoints" / "last.ckpt"


def budget_tags(run: RunSpec) -> dict[str, str]:
    return {"ablate.budget_steps": str(run.train.steps), "ablate.budget_tokens": str(run.train.tokens)}


def train_budgets(
    run: RunSpec,
    *,
    workspace: Path,
    tracking_uri: str | None = None,
    parent_run_id: str | None = None,
    progress: bool = True,
    extra_tags: dict[str, str] | None = None,
    callbacks: list[L.Callback] | None = None,
    on_result: Any = None,
) -> list[TrainResult]:
    """Train `run` to its largest budget, then each smaller budget's cooldown from its branch point.

    Returns the results, longest first; `on_result(run, result)` is called as each one finishes (the sweep
    records it in the trial at once). A run without budgets is just trained."""
    branches = run.branches()
    points = BranchPoints({b.train.cooldown_start: branch_checkpoint(workspace, b) for b in branches})
    longest = train_run(
        run,
        workspace=workspace,
        tracking_uri=tracking_uri,
        parent_run_id=parent_run_id,
        progress=progress,
        extra_tags={**(extra_tags or {}), **(budget_tags(run) if branches else {})},
        callbacks=[*(callbacks or []), *([points] if branches else [])],
    )
    results = [longest]
    if on_result:
        on_result(run, longest)
    for branch in reversed(branches):  # the latest branch point first: its checkpoint is the newest
        folder = run_dir(workspace, branch)
        if not (folder / "checkpoints" / "last.ckpt").exists() and not (folder / "result.json").exists():
            print(
                f"[budgets] {branch.name} at {branch.train.steps} steps: no branch checkpoint; "
                "training the budget from step 0",
                flush=True,
            )
        result = train_run(
            branch,
            workspace=workspace,
            tracking_uri=tracking_uri,
            parent_run_id=parent_run_id,
            progress=progress,
            extra_tags={
                **(extra_tags or {}),
                **budget_tags(branch),
                "ablate.branched_from": longest.run_id,
                "ablate.branch_step": str(branch.train.cooldown_start),
            },
        )
        results.append(result)
        if on_result:
            on_result(branch, result)
    return results
