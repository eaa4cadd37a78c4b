"""`python -m ablate.train.rank SPEC`: a local rank > 0 of a multi-device run, started by `ablate.train.launch`.

Its own module so that `ablate.train.launch` (process plumbing, imported by `ablate.train.loop`) never imports the
training code back: this entry point sits above both.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ablate.recipe.resolve import RunSpec
from ablate.train.launch import exit_with_parent
from ablate.train.loop import Diverged, train_rank


def main(argv: list[str]) -> int:
    """A local rank > 0: train the run in SPEC alongside rank 0 (no MLflow, no result files)."""
    exit_with_parent()
    spec = json.loads(Path(argv[0]).read_text())
    run = RunSpec.from_json(spec["run"])
    try:
        train_rank(run, workspace=Path(spec["workspace"]))
    except Diverged as e:  # every rank sees the same reduced numbers: rank 0 reports it
        print(f"[rank {os.environ.get('LOCAL_RANK')}] {e}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
