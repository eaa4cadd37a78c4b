"""First commands on a new workspace make its MLflow store once, whole, or not at all
(ablate.store.sqlite_store), and a write its disk refuses is one line (ablate.store.write_failure): two
commands at once, a full disk (a small tmpfs) then space freed, a file-size limit (`ulimit -f`) on the
store's creation and on its later writes. Real processes, real SQLite stores and real mounts under
tmp_path."""

from __future__ import annotations

import contextlib
import resource
import subprocess
import sys
from pathlib import Path

from mini_project import cli_command, one_line_refusal, write_recipe

from ablate.cli import main
from ablate.store import sqlite_store, tracking
from ablate.store.stores import Stores

# What every verb does first, in a fresh interpreter: the workspace's store opened through
# Stores.client() (the creation path of every command), an experiment and a run recorded in it.
FIRST_COMMAND = """
import sys
from ablate.store import tracking
from ablate.store.stores import Stores

stores = Stores(sys.argv[1])
client = stores.client()
experiment = tracking.get_experiment_id(client, sys.argv[2], stores.workspace)
run = client.create_run(experiment, run_name="r")
client.log_metric(run.info.run_id, "loss", 1.0)
client.set_terminated(run.info.run_id)
"""


def _first_command(workspace: Path, name: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", FIRST_COMMAND, str(workspace), name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _train(recipe: Path, workspace: Path, variant: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        cli_command("train", str(recipe), "--variant", variant, "--workspace", str(workspace)),
        cwd=recipe.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def _succeeded(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-2000:] + err[-3000:]
        assert "Traceback" not in err, err[-3000:]


def _runs(workspace: Path) -> int:
    client = Stores(workspace).client()
    experiments = [e.experiment_id for e in client.search_experiments()]
    return len(client.search_runs(experiments))


def _third_command(workspace: Path) -> None:
    """The first step of a third command, in this process: the store opened, a run recorded in it."""
    sqlite_store._CHECKED.clear()
    stores = Stores(workspace)
    client = stores.client()
    run = client.create_run(tracking.get_experiment_id(client, "third", stores.workspace), run_name="r")
    client.set_terminated(run.info.run_id)


def test_two_first_commands_at_once_on_a_new_workspace_both_succeed_five_times(tmp_path):
    """Two `ablate train` at once on a missing workspace (the tiniest mini run), then four more pairs of
    the cheaper first step of every command in fresh interpreters (Stores.client(), then an experiment
    and a run recorded: the same creation path, sqlite_store.check, without the training); after each
    pair a third command's first step."""
    recipe = write_recipe(tmp_path, base__train__steps=1, base__train__val_every=1)
    workspace = tmp_path / "ws0"
    _succeeded([_train(recipe, workspace, "transformer"), _train(recipe, workspace, "diff")])
    _third_command(workspace)
    assert _runs(workspace) == 3
    for i in range(1, 5):
        workspace = tmp_path / f"ws{i}"
        _succeeded([_first_command(workspace, "a"), _first_command(workspace, "b")])
        _third_command(workspace)
        assert _runs(workspace) == 3
        assert not list(workspace.glob("*mlflow.db.*"))  # no creation left over, nothing set aside


@contextlib.contextmanager
def _tmpfs(where: Path, size: str):
    """A tmpfs of `size` mounted at `where` (the tests run as root: no test is skipped here)."""
    where.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def test_a_full_disk_while_the_store_is_created_is_one_line_and_the_store_is_made_once_space_is_freed(
    tmp_path, capsys
):
    recipe = write_recipe(tmp_path, base__train__steps=2, base__train__val_every=2)
    workspace = tmp_path / "ws"
    argv = ["train", str(recipe), "--variant", "transformer", "--workspace", str(workspace)]
    with _tmpfs(workspace, "300k"):  # less than a whole store (about 1 MB)
        capsys.readouterr()
        code = main(argv)
        one_line_refusal(capsys, code, f"could not create the MLflow store {workspace / 'mlflow.db'}", "full")
        assert not (workspace / "mlflow.db").exists() and not list(workspace.glob(".mlflow.db*"))
        subprocess.run(["mount", "-o", "remount,size=16m", str(workspace)], check=True)  # space freed
        sqlite_store._CHECKED.clear()
        capsys.readouterr()
        assert main(argv) == 0, capsys.readouterr().err
        assert _runs(workspace) == 1


def _file_size_limit(limit: int):
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return set_limit


def test_a_file_size_limit_on_the_store_is_one_line_when_it_is_made_and_when_it_is_written(tmp_path):
    """`ulimit -f 400` (400 KiB): below a whole store, so its creation fails in one line and leaves
    nothing; with the store made, a training run's writes to it fail in one line too; without the limit
    the same command then succeeds (the run resumes)."""
    recipe = write_recipe(tmp_path, base__train__steps=2, base__train__val_every=2)
    workspace = tmp_path / "ws"
    limited = _train(recipe, workspace, "transformer", preexec_fn=_file_size_limit(400 * 1024))
    out, err = limited.communicate(timeout=600)
    assert limited.returncode == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "could not create the MLflow store" in err and "file-size limit" in err, err
    assert not (workspace / "mlflow.db").exists() and not list(workspace.glob(".mlflow.db.*"))

    Stores(workspace).client()  # the store made (about 1 MB), then the limit hits its next writes
    limited = _train(recipe, workspace, "transformer", preexec_fn=_file_size_limit(400 * 1024))
    out, err = limited.communicate(timeout=600)
    assert limited.returncode == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "the MLflow store could not be written" in err and "disk I/O error" in err, err

    assert main(["train", str(recipe), "--variant", "transformer", "--workspace", str(workspace)]) == 0
    client = Stores(workspace).client()
    (run,) = client.search_runs([client.get_experiment_by_name("mini").experiment_id])
    assert run.info.status == "FINISHED"  # the run the limit stopped, resumed and finished: one run
