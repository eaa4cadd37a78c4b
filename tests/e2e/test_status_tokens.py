"""`ablate status` on a budgeted sweep whose worker is killed mid-trial: its token total is the printed
plan's (each budget's cooldown included), and it counts the running trial's tokens from its MLflow runs
(the last logged step), so the ETA shows before any trial finished. A real sweep, Optuna study and MLflow
store; every wait is for an event, pytest's timeout the hang guard."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import mlflow
import optuna
import pytest
from mini_project import cli_command, write_recipe
from optuna.trial import TrialState

from ablate.cli import main
from ablate.core.tables import si
from ablate.store.stores import Stores

STEPS, BATCH_TOKENS = 64, 256


def _branch_training(client) -> bool:
    """Has a budget's cooldown branch logged a training step (the longest run is done, a branch runs)?"""
    experiment = client.get_experiment_by_name("mini")
    if experiment is None:
        return False
    runs = client.search_runs([experiment.experiment_id])
    return any("ablate.branched_from" in r.data.tags and r.data.metrics.get("tokens") for r in runs)


def _logged_tokens(client) -> int:
    """What the MLflow runs say was trained: each run's last logged `tokens`, less a branch's start."""
    experiment = client.get_experiment_by_name("mini")
    total = 0
    for run in client.search_runs([experiment.experiment_id]):
        history = client.get_metric_history(run.info.run_id, "tokens")
        if not history:
            continue
        start = int(run.data.tags.get("ablate.branch_step", 0)) * BATCH_TOKENS
        total += int(max(m.value for m in history)) - start
    return total


@pytest.mark.slow
def test_status_counts_the_plans_tokens_and_a_running_trials_progress(tmp_path, capsys):
    recipe = write_recipe(
        tmp_path,
        base__train__schedule="wsd",
        base__train__steps=STEPS,
        base__train__val_every=16,
        budgets={"steps": [16, 32, STEPS]},
    )
    workspace = tmp_path / "ws"
    log = tmp_path / "sweep.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cli_command("sweep", str(recipe), "--yes", "--workspace", str(workspace)),
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
            start_new_session=True,
            preexec_fn=lambda: os.nice(10),  # the watcher below sees each step before the next
        )
    try:
        while "trial 1/2:" not in log.read_text():  # its MLflow run is open: the store is made
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)
        client = mlflow.MlflowClient(Stores(workspace).mlflow_uri())
        while not _branch_training(client):
            assert proc.poll() is None, f"the sweep ended before a branch trained:\n{log.read_text()}"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # the worker dies mid-trial: the trial stays RUNNING
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    planned = re.search(r"plan: 2 trials, (\S+) tokens", log.read_text()).group(1)
    # 2 trials x (64 steps + the cooldowns of the budgets of 32 and 16 steps: 6 + 3) x 256 tokens
    assert planned == si(2 * (STEPS + 6 + 3) * BATCH_TOKENS)
    study = optuna.load_study(study_name="mini", storage=Stores(workspace).storage())
    assert study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))  # killed mid-trial
    done = _logged_tokens(client)
    assert done > STEPS * BATCH_TOKENS  # the longest run and part of a branch

    capsys.readouterr()
    assert main(["status", str(recipe), "--workspace", str(workspace)]) == 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("tokens:")]
    assert line.startswith(f"tokens: {si(done)} of {planned} done; ETA "), line
    assert "ETA -" not in line and "ETA done" not in line, line  # a rate from the running trial
