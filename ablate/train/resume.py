"""Which checkpoint a run resumes from, and where its folder is.

A run's folder holds its checkpoints (`checkpoints/last.ckpt`, `best.ckpt`) and its `result.json`; a
killed run resumes from the newest checkpoint it can read (a file truncated by a kill or a full disk is
kept beside, renamed, and the next one tried).
"""

from __future__ import annotations

from pathlib import Path

from ablate.core.workspace import Workspace
from ablate.recipe.resolve import RunSpec
from ablate.store import tracking
from ablate.train import checkpoint_files


def run_dir(workspace: Workspace, run: RunSpec) -> Path:
    """The run's folder in the workspace: checkpoints, result.json, its lock."""
    return workspace.run_folder(tracking.experiment_name(run.recipe, run.scale), f"{run.name}-{run.key}")


def checkpoint_step(path: Path) -> int:
    return checkpoint_files.step(path)


def resume_point(checkpoints: Path, rank: int = 0) -> tuple[int, Path | None]:
    """(step, checkpoint) to resume from: `last.ckpt`, or where it cannot be read (truncated by a kill or a
    full disk) the run's best checkpoint, or else the run's start, said in a line. The unreadable file is
    kept beside, renamed `*.unreadable`, not deleted. A sharded checkpoint (fsdp) is a folder of the same
    name; one a kill left mid-swap is read from its whole previous folder (ablate.train.checkpoint_files)."""
    for name in ("last.ckpt", "best.ckpt"):
        for path in checkpoint_files.candidates(checkpoints / name):
            try:
                return checkpoint_step(path), path
            except Exception as e:  # noqa: BLE001 - torch.load raises RuntimeError, EOFError, pickle errors...
                where = (
                    "its best checkpoint"
                    if name == "last.ckpt" and (checkpoints / "best.ckpt").exists()
                    else ""
                )
                print(
                    f"[train] {path} cannot be read ({type(e).__name__}: {str(e).splitlines()[0][:100]}); "
                    f"resuming from {where or 'step 0'} (the file is kept as {path.name}.unreadable)",
                    flush=True,
                )
                if rank == 0:
                    path.replace(path.with_name(f"{path.name}.unreadable"))
    return 0, None


ACCUMULATE = "ablate_accumulate"  # the checkpoint's micro-batches per optimizer step on each rank


def rescale_batches(checkpoint: dict, accumulate: int) -> None:
    """A checkpoint saved on another number of ranks (fsdp resumes on any): Lightning's training loop
    counts micro-batches, not steps, and places optimizer steps and validations by that count, so its
    counts are rewritten in this run's micro-batches per step (`accumulate`), in place. The data position
    needs nothing: the loaders start at the step's global micro-batch (ablate.train.loaders)."""
    saved = int(checkpoint.get(ACCUMULATE, accumulate))
    if saved == accumulate:
        return
    progress = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    for counts in (progress["total"], progress["current"]):
        for name, value in counts.items():
            counts[name] = value // saved * accumulate
