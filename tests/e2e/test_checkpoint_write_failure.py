"""A checkpoint that cannot be written is one line and an exit, never a traceback or a hang, whatever the
write's error: here EFBIG, a file size limit (`ulimit -f`, RLIMIT_FSIZE) below one checkpoint but above
every other file the run writes. The full-disk case (ENOSPC) is test_corrupt_stores.py's.

`ablate train` runs in a fresh interpreter with the limit set (a real Lightning Trainer, a real MLflow store
in the workspace); the subprocess timeout is what a hang would hit.
"""

from __future__ import annotations

import resource
import sqlite3
import subprocess
from pathlib import Path

from mini_project import cli_command, write_recipe

LIMIT = 2 << 20  # bytes: above the store and the token cache, below one checkpoint of a d_model 128 model


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def test_a_checkpoint_over_the_file_size_limit_is_one_line_and_an_exit(tmp_path):
    recipe = write_recipe(tmp_path, base__model__d_model=128)
    workspace = tmp_path / "ws"
    proc = subprocess.run(
        cli_command("train", str(recipe), "--variant", "transformer", "--workspace", str(workspace)),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        preexec_fn=_limited,
    )
    err = [line for line in proc.stderr.splitlines() if line.startswith("ablate: error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(err) == 1, proc.stderr[-3000:]
    assert "checkpoint: cannot write a checkpoint into" in err[0] and "File too large" in err[0], err
    assert "ulimit -f" in err[0] and str(workspace / "runs") in err[0]
    with sqlite3.connect(workspace / "mlflow.db") as db:  # the store beside it is whole and holds the run
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert db.execute("SELECT count(*) FROM runs").fetchone()[0] >= 1
    assert all(p.stat().st_size <= LIMIT for p in Path(tmp_path).rglob("*") if p.is_file())
