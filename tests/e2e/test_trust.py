"""What is trusted and what is not: a recipe is code (ablate check says so), a Slurm option is one line of
the batch script (a newline in it is refused), and a password in a store's URL never reaches a child's
argument list (`ps` shows those): local workers and `mlflow server` get it through their environment."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from mini_project import write_recipe

from ablate.cli import main
from ablate.recipe.loading import load_recipe
from ablate.recipe.search import SearchSpec
from ablate.store.stores import STORAGE_ENV, Stores, passed_down
from ablate.store.study import SweepContext
from ablate.sweep.worker import worker_argv

SECRET = "s3cret-pw"


def test_check_says_a_recipe_is_code(tmp_path, capsys):
    assert main(["check", str(write_recipe(tmp_path)), "--workspace", str(tmp_path / "ws")]) == 0
    assert (
        "a recipe is code: its imports: and class_path import and run what they name"
        in capsys.readouterr().out
    )


def test_a_newline_in_a_slurm_option_is_one_line_and_nothing_runs(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    in_file = write_recipe(tmp_path, "in-file.yaml", launcher={"slurm": {"partition": "gpu\nhostname"}})
    for argv in (
        [str(recipe), "--launcher.slurm.sbatch_lines", '["comment=x\\ntouch pwned;#"]'],
        [str(in_file)],
    ):
        assert main(["check", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "newline or another control character" in err, err
    assert not (tmp_path / "pwned").exists()


def test_a_local_workers_storage_password_travels_in_its_environment(tmp_path, monkeypatch):
    url = f"postgresql://ablate:{SECRET}@127.0.0.1:5432/ablate_optuna"
    recipe = load_recipe(write_recipe(tmp_path), [], scale=None)
    ctx = SweepContext(
        recipe=recipe,
        scale=recipe.scale,
        seeds=[0],
        stores=Stores(tmp_path / "ws", None, url),
        search=SearchSpec(),
        search_path=None,
        grace_period=60.0,
    )
    argv, env = worker_argv(ctx, [])
    assert SECRET not in " ".join(argv) and "--storage" not in argv
    assert env[STORAGE_ENV] == url
    monkeypatch.setenv(STORAGE_ENV, url)  # the worker, started with that environment, finds it there
    assert passed_down(None, None) == (None, url)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mlflow_server(port: int) -> int | None:
    """The pid of an `mlflow server` child listening on `port`, from /proc."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"mlflow" in argv and b"server" in argv and str(port).encode() in argv:  # `-m mlflow server`
            return int(proc.name)
    return None


def test_mlflow_server_gets_the_backend_password_through_its_environment(tmp_path):
    port, db_port = _free_port(), _free_port()  # nothing listens on db_port: the server cannot start
    uri = f"postgresql://ablate:{SECRET}@127.0.0.1:{db_port}/ablate_mlflow"
    cmd = [sys.executable, "-m", "ablate.cli", "server", "--backend-store-uri", uri, "--port", str(port)]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        child = None
        deadline = time.monotonic() + 120
        while child is None and proc.poll() is None and time.monotonic() < deadline:
            child = _mlflow_server(port)
            time.sleep(0.05)
        assert child is not None, proc.communicate(timeout=60)[0].decode()[-2000:]
        argv = Path(f"/proc/{child}/cmdline").read_bytes()
        environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        assert SECRET.encode() not in argv
        given = [e for e in environ if e.startswith(b"MLFLOW_BACKEND_STORE_URI=")]  # (+psycopg: the driver)
        assert len(given) == 1 and SECRET.encode() in given[0] and b"@127.0.0.1:" in given[0]
    finally:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        proc.wait(timeout=60)
