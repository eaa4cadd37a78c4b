"""`--launcher slurm` where it cannot work: one line, exit 2, nothing enqueued; and `ablate status` on a
sweep with a trial running in a Slurm task."""

from __future__ import annotations

import shutil
import time

import optuna
import pytest
from mini_project import write_recipe
from optuna.trial import TrialState

from ablate.cli import main
from ablate.core.errors import UserError
from ablate.recipe.loading import load_recipe
from ablate.store.stores import Stores
from ablate.store.study import SweepContext
from ablate.sweep.queue import trial_id
from ablate.sweep.slurm import check_cluster_stores
from ablate.train.launch import free_port


def test_a_slurm_sweep_without_slurm_says_so_in_one_line_and_enqueues_nothing(tmp_path, monkeypatch, capsys):
    recipe = write_recipe(tmp_path)
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no sbatch here
    workspace = tmp_path / "ws"
    code = main(["sweep", str(recipe), "--launcher", "slurm", "--yes", "--workspace", str(workspace)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith("ablate: error: --launcher: slurm needs Slurm's `sbatch` and `sinfo` on PATH")
    assert not (workspace / "optuna.journal").exists()  # checked before anything was enqueued


def test_the_recipe_launcher_section_is_typed_and_set_from_the_command_line(tmp_path, capsys):
    recipe = write_recipe(tmp_path, launcher={"slurm": {"partition": "gpu"}})
    loaded = load_recipe(recipe, [("launcher.slurm.time_min", 240)], scale=None)
    assert (loaded.file.launcher.slurm.partition, loaded.file.launcher.slurm.time_min) == ("gpu", 240)
    assert main(["check", str(recipe), "--launcher.slurm.gpus_per_worker", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == "ablate: error: launcher.slurm.gpus_per_worker: expected a non-negative integer, got -1 (int)"
    )
    workspace = tmp_path / "ws"
    args = ["sweep", str(recipe), "--launcher", "slurm", "--workspace", str(workspace)]
    assert main([*args, "--launcher.slurm.sbatch_lines", '["--exclusive"]']) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ablate: error: launcher.slurm.sbatch_lines: '--exclusive' is not key=value; write")
    assert not (workspace / "optuna.journal").exists()


def test_workers_on_several_nodes_are_refused_a_sqlite_store(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path), [])

    def ctx(**urls) -> SweepContext:
        stores = Stores(tmp_path / "ws", **urls)
        return SweepContext(recipe=recipe, scale=recipe.scale, seeds=[0], stores=stores)

    with pytest.raises(
        UserError, match=r"^--tracking-uri: workers on 3 nodes cannot share a SQLite tracking"
    ):
        check_cluster_stores(ctx(), nodes=3)
    with pytest.raises(UserError, match=r"^--storage: workers on 2 nodes cannot share a SQLite study"):
        check_cluster_stores(ctx(tracking_uri="http://track:5000", storage_url="sqlite:///s.db"), nodes=2)
    check_cluster_stores(ctx(), nodes=1)  # one node shares the workspace's files like local workers
    check_cluster_stores(ctx(tracking_uri="http://track:5000", storage_url="journal:/shared/j"), nodes=4)


@pytest.mark.slow
def test_status_shows_finished_running_and_waiting_trials_and_where_they_run(tmp_path, capsys):
    recipe = write_recipe(tmp_path, seeds=[0, 1])
    workspace = tmp_path / "ws"
    base = [str(recipe), "--workspace", str(workspace)]
    assert main(["sweep", *base, "--no-train", "--yes"]) == 0
    storage = Stores(workspace).storage()
    study = optuna.load_study(study_name="mini", storage=storage)
    first, second = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))[:2]
    for trial, state in ((first, TrialState.COMPLETE), (second, TrialState.RUNNING)):  # as two workers would
        tid = trial_id(study, storage, trial.number)
        storage.set_trial_state_values(tid, state=TrialState.RUNNING)
        for key, value in {"worker_host": "node7", "slurm_job": "41_1", "heartbeat": time.time()}.items():
            storage.set_trial_user_attr(tid, key, value)
        if state == TrialState.COMPLETE:
            storage.set_trial_state_values(tid, state=state, values=[2.5])
    capsys.readouterr()
    assert main(["status", *base]) == 0
    out = capsys.readouterr().out
    assert "1/4 trials finished, 1 running, 2 waiting, 0 failed" in out
    assert "tokens: 2.05K of 8.19K done" in out
    (row,) = [line for line in out.splitlines() if "node7" in line]
    assert [c.strip() for c in row.strip("|").split("|")][:6] == [
        str(second.number),
        "transformer-s1",
        "running",
        "node7",
        "41_1",
        "-",
    ]


def test_a_slurm_sweep_whose_controller_is_down_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    if shutil.which("sinfo") is None:
        pytest.skip("Slurm's sinfo missing: apt-get install slurm-wlm")
    conf = tmp_path / "slurm.conf"  # a controller on a port where none listens
    conf.write_text(
        f"ClusterName=down\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort={free_port()}\n"
        "MessageTimeout=2\nNodeName=localhost CPUs=1\nPartitionName=debug Nodes=ALL Default=YES\n"
    )
    monkeypatch.setenv("SLURM_CONF", str(conf))
    workspace = tmp_path / "ws"
    code = main(["sweep", str(write_recipe(tmp_path)), "--launcher", "slurm", "--workspace", str(workspace)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith("ablate: error: --launcher: slurm: the Slurm controller does not answer (sinfo: ")
    assert not (workspace / "optuna.journal").exists()
