"""Which checkpoint a run resumes from, and where its folder is.

A run's folder holds its checkpoints (`checkpoints/last.ckpt`, `best.ckpt`) and its `result.json`; a
killed run resumes from the newest checkpoint it can read (a file truncated by a kill or a full disk is
kept beside, renamed, and the next one tried).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ablate.core.workspace import Workspace
from ablate.recipe.resolve import RunSpec
from ablate.store import tracking


def run_dir(workspace: Workspace, run: RunSpec) -> Path:
    """The run's folder in the workspace: checkpoints, result.json, its lock."""
    return workspace.run_folder(tracking.experiment_name(run.recipe, run.scale), f"{run.name}-{run.key}")


def checkpoint_step(path: Path) -> int:
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    return int(checkpoint["global_step"])


def resume_point(checkpoints: Path, rank: int = 0) -> tuple[int, Path | None]:
    """(step, checkpoint) to resume from: `last.ckpt`, or where it cannot be read (truncated by a kill or a
    full disk) the run's best checkpoint, or else the run's start, said in a line. The unreadable file is
    kept beside, renamed `*.unreadable`, not deleted."""
    for name in ("last.ckpt", "best.ckpt"):
        path = checkpoints / name
        if not path.exists():
            continue
        try:
            return checkpoint_step(path), path
        except Exception as e:  # noqa: BLE001 - torch.load raises RuntimeError, EOFError, pickle errors...
            where = (
                "its best checkpoint" if name == "last.ckpt" and (checkpoints / "best.ckpt").exists() else ""
            )
            print(
                f"[train] {path} cannot be read ({type(e).__name__}: {str(e).splitlines()[0][:100]}); "
                f"resuming from {where or 'step 0'} (the file is kept as {name}.unreadable)",
                flush=True,
            )
            if rank == 0:
                path.replace(path.with_name(f"{name}.unreadable"))
    return 0, None
