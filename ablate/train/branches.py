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

import json
import shutil
from pathlib import Path
from typing import Any, Unpack

import lightning.pytorch as L

from ablate.core.workspace import Workspace
from ablate.recipe.resolve import RunSpec
from ablate.store import names, tracking
from ablate.store.stores import Stores
from ablate.train import checkpoint_files
from ablate.train.records import TrainResult
from ablate.train.resume import run_dir
from ablate.train.run import TrainOptions, train_run


class BranchPoints(L.Callback):
    """Saves a resumable checkpoint when training finishes optimizer step `step`, for each step given.

    Saved after the optimizer and lr-scheduler steps (Lightning's on_train_batch_end, as ModelCheckpoint's
    every_n_train_steps), whole or not at all (ablate.train.checkpoint_files: a file, or fsdp's sharded
    folder), so a kill never leaves half a checkpoint."""

    def __init__(self, paths: dict[int, Path | list[Path]]):
        self.paths = {step: p if isinstance(p, list) else [p] for step, p in paths.items()}

    def on_train_batch_end(
        self, trainer: L.Trainer, module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # mid-accumulation: the step has not happened yet
        for path in self.paths.get(trainer.global_step, []):
            if path.exists():
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            checkpoint_files.save(trainer, path)


def branch_points(run: RunSpec, workspace: Workspace) -> list[L.Callback]:
    """The callback that saves `run`'s branch points (none without budgets): each budget's, and the stable
    phase's last state, kept so that a longer budget can continue from it. Every rank of the run trains
    with it (ablate.train.rank): saving a checkpoint is a collective, and under fsdp each rank writes its
    own shard."""
    branches = run.branches()
    if not branches:
        return []
    paths: dict[int, list[Path]] = {}
    for b in branches:
        paths.setdefault(b.train.cooldown_start, []).append(branch_checkpoint(workspace, b))
    stable = stable_folder(workspace, run) / f"step-{run.train.cooldown_start}.ckpt"
    paths.setdefault(run.train.cooldown_start, []).append(stable)
    return [BranchPoints(paths)]


def branch_checkpoint(workspace: Workspace, branch: RunSpec) -> Path:
    """Where a budget's run finds the state it starts its cooldown from: its own resume checkpoint."""
    return run_dir(workspace, branch) / "checkpoints" / "last.ckpt"


def stable_key(run: RunSpec) -> str:
    """A hash of everything that defines the run but its length (`train.steps`): runs of one (variant,
    size, seed) that differ only in their budget share it, and so share their stable phase."""
    return run.identity(without=("steps",))


def stable_folder(workspace: Workspace, run: RunSpec) -> Path:
    """Where the kept stable-phase state of the run's (variant, size, seed) lives: one checkpoint at most."""
    return workspace.stable_folder(
        tracking.experiment_name(run.recipe, run.scale), f"{run.name}-{stable_key(run)}"
    )


def stable_checkpoint(workspace: Workspace, run: RunSpec) -> tuple[int, Path] | None:
    """(step, path) of the kept stable-phase checkpoint of the run's (variant, size, seed), or None."""
    kept = sorted(
        (int(p.stem.removeprefix("step-")), p) for p in stable_folder(workspace, run).glob("step-*.ckpt")
    )
    return kept[-1] if kept else None


def _keep_latest(workspace: Workspace, run: RunSpec, source_run_id: str) -> None:
    """After the longest run: one stable checkpoint stays, the latest, with the MLflow run that made it
    (this run's; or a longer run's kept before, which keeps its own record)."""
    latest = stable_checkpoint(workspace, run)
    if latest is None:
        return
    for path in stable_folder(workspace, run).glob("step-*.ckpt"):
        if path != latest[1]:
            checkpoint_files.remove(path)
    if latest[0] != run.train.cooldown_start:
        return
    meta = {"step": latest[0], "run_id": source_run_id, "run_key": run.key}
    (stable_folder(workspace, run) / "source.json").write_text(json.dumps(meta))


def _continue_from_stable(workspace: Workspace, run: RunSpec) -> dict[str, str]:
    """Start a new longest run from the kept stable state of a shorter one, if there is one it can use.

    Usable: saved at or before this run's cooldown start (the lr up to there is the same). The checkpoint
    (a file, or fsdp's sharded folder) is copied as the run's resume checkpoint; returns the tags that say
    where the run came from."""
    folder = run_dir(workspace, run)
    kept = stable_checkpoint(workspace, run)
    if (folder / "result.json").exists() or (folder / "checkpoints" / "last.ckpt").exists() or kept is None:
        return {}
    step, path = kept
    if step > run.train.cooldown_start:
        return {}
    (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
    checkpoint_files.copy(path, folder / "checkpoints" / "last.ckpt")
    source = path.parent / "source.json"
    meta = json.loads(source.read_text()) if source.exists() else {}
    print(
        f"[budgets] {run.name} at {run.train.steps} steps: continuing from the stable phase kept at step "
        f"{step}; training {run.train.steps - step} steps",
        flush=True,
    )
    return {names.CONTINUED_FROM: meta.get("run_id", ""), names.CONTINUED_STEP: str(step)}


def stable_size(workspace: Workspace, runs: list[RunSpec]) -> tuple[int, int]:
    """(files, bytes) of the kept stable-phase checkpoints of `runs`."""
    kept = [k[1] for k in (stable_checkpoint(workspace, r) for r in runs) if k is not None]
    return len(kept), sum(checkpoint_files.size(p) for p in kept)


def prune_stable(workspace: Workspace, runs: list[RunSpec]) -> tuple[int, int]:
    """Delete the kept stable-phase checkpoints of `runs` (the study is final); returns (files, bytes)."""
    files, size = stable_size(workspace, runs)
    for run in runs:
        shutil.rmtree(stable_folder(workspace, run), ignore_errors=True)
    return files, size


def budget_tags(run: RunSpec) -> dict[str, str]:
    return {names.BUDGET_STEPS: str(run.train.steps), names.BUDGET_TOKENS: str(run.train.tokens)}


def train_budgets(
    run: RunSpec,
    stores: Stores,
    *,
    every_run_callbacks: list[L.Callback] | None = None,
    on_result: Any = None,
    **options: Unpack[TrainOptions],
) -> list[TrainResult]:
    """Train `run` to its largest budget, then each smaller budget's cooldown from its branch point.

    Returns the results, longest first; `on_result(run, result)` is called as each one finishes (the sweep
    records it in the trial at once). A run without budgets is just trained. `options` are `train_run`'s
    for every run; its `callbacks` go to the longest run only (a pruner reports its steps once),
    `every_run_callbacks` to every run, branches included (the sweep's check that its trial was not handed
    to another worker)."""
    workspace = stores.workspace
    branches = run.branches()
    continued = _continue_from_stable(workspace, run) if branches else {}
    extra_tags = options.get("extra_tags") or {}
    longest = train_run(
        run,
        stores,
        **{
            **options,
            "extra_tags": {**extra_tags, **(budget_tags(run) if branches else {}), **continued},
            "callbacks": [
                *(options.get("callbacks") or []),
                *(every_run_callbacks or []),
                *branch_points(run, workspace),
            ],
        },
    )
    if branches:
        _keep_latest(workspace, run, longest.run_id)
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
        tags = {
            **extra_tags,
            **budget_tags(branch),
            names.BRANCHED_FROM: longest.run_id,
            names.BRANCH_STEP: str(branch.train.cooldown_start),
        }
        result = train_run(
            branch, stores, **{**options, "extra_tags": tags, "callbacks": list(every_run_callbacks or [])}
        )
        results.append(result)
        if on_result:
            on_result(branch, result)
    return results
