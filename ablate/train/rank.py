"""`python -m ablate.train.rank SPEC`: a local rank > 0 of a multi-device run, started by `ablate.train.launch`.

Its own module so that `ablate.train.launch` (process plumbing, imported by `ablate.train.run`) never imports the
training code back: this entry point sits above both.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from ablate.core.workspace import Workspace
from ablate.recipe.resolve import RunSpec
from ablate.train.branches import branch_points
from ablate.train.launch import exit_with_parent
from ablate.train.module import Diverged
from ablate.train.run import train_rank


def main(argv: list[str]) -> int:
    """A local rank > 0: train the run in SPEC alongside rank 0 (no MLflow, no result files)."""
    exit_with_parent()
    spec = json.loads(Path(argv[0]).read_text())
    run = RunSpec.from_json(spec["run"])
    try:
        workspace = Workspace(spec["workspace"])
        train_rank(run, workspace=workspace, callbacks=branch_points(run, workspace))
    except Diverged as e:  # every rank sees the same reduced numbers: rank 0 reports it
        print(f"[rank {os.environ.get('LOCAL_RANK')}] {e}", file=sys.stderr)
        return 3
    return 0


def follow(folder: Path, poll_s: float = 0.2) -> int:
    """A Slurm task other than task 0 of a multi-task sweep worker (ablate.sweep.slurm): train each run task
    0 publishes in `folder` (ablate.train.launch.publish_spec), as this task's rank, until it says done."""
    n = 0
    while True:
        spec_file = folder / f"{n}.json"
        if not spec_file.exists():
            time.sleep(poll_s)
            continue
        spec = json.loads(spec_file.read_text())
        if spec.get("done"):
            return 0
        run = RunSpec.from_json(spec["run"])
        print(f"[rank {os.environ.get('SLURM_PROCID')}] training {run.name}", flush=True)
        try:
            workspace = Workspace(spec["workspace"])
            train_rank(run, workspace=workspace, callbacks=branch_points(run, workspace))
        except Diverged as e:  # task 0 marks the trial failed and goes on to the next: so does this rank
            print(f"[rank {os.environ.get('SLURM_PROCID')}] {e}", file=sys.stderr, flush=True)
        n += 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
