"""A workspace path is a path whatever its characters: `?`, `%20` and `#` in it stay in the file names
(the MLflow SQLite URL quotes them: ablate.store.sqlite_store.sqlite_url), so the store lands inside the
workspace and nothing is written beside it. The real CLI trains the mini recipe into such a workspace.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from mini_project import write_recipe

from ablate.cli import main
from ablate.store.sqlite_store import sqlite_path, sqlite_url


def test_a_url_made_from_a_path_names_that_path():
    for name in ("/tmp/ws?q=1/mlflow.db", "/tmp/a%20b/mlflow.db", "/tmp/h#1 x/mlflow.db", "/tmp/%/m.db"):
        from sqlalchemy.engine import make_url

        assert make_url(sqlite_url(Path(name))).database == name  # as SQLAlchemy (MLflow's driver) reads it
        assert sqlite_path(sqlite_url(Path(name))) == Path(name)


def test_training_into_a_workspace_named_with_url_characters_keeps_the_store_inside_it(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    workspace = tmp_path / "ws?q=1 a%20b#c"
    before = sorted(p.name for p in tmp_path.iterdir())
    code = main(["train", str(recipe), "--variant", "transformer", "--workspace", str(workspace)])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*before, workspace.name]
    )  # nothing beside it
    with sqlite3.connect(workspace / "mlflow.db") as db:  # a plain path: no URL parsing here
        assert db.execute("SELECT status FROM runs").fetchall() == [("FINISHED",)]
    artifacts = [p for p in (workspace / "artifacts").rglob("*") if p.is_file()]
    assert artifacts and all(p.is_relative_to(workspace) for p in artifacts)


def test_the_printed_ui_command_runs_as_printed_whatever_the_workspaces_characters(tmp_path, capsys):
    import shlex

    from ablate.verbs.options import Shared, print_ui_link, sweep_context

    recipe = write_recipe(tmp_path)
    workspace = tmp_path / "my runs; rm -rf ~ $(x) 'q'"
    opts = Shared(workspace=str(workspace))
    print_ui_link(sweep_context(str(recipe), opts, None, 60.0, None), opts)
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("MLflow UI: ")]
    command = line[len("MLflow UI: ") :].split("  -> ")[0]
    assert shlex.split(command) == ["ablate", "ui", "--workspace", str(workspace)]
