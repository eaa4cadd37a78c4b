"""Many workers on one PostgreSQL-backed study, logging to one MLflow server: each trial exactly once,
and a worker killed with SIGKILL mid-trial has its trial resumed by another."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import time
from pathlib import Path

import mlflow
import optuna
import pytest
from optuna.trial import TrialState
from scaleout_helpers import cli_command, cli_env, write_recipe

from ablate.cli import main

pytestmark = pytest.mark.scaleout


def _load_study(url: str, name: str = "mini"):
    from ablate.store.tracking import database_url

    return optuna.load_study(study_name=name, storage=database_url(url))


def _start_worker(
    recipe: Path, storage: str, tracking_uri: str, workspace: Path, log: Path
) -> subprocess.Popen:
    args = cli_command(
        "worker",
        str(recipe),
        "--storage",
        storage,
        "--tracking-uri",
        tracking_uri,
        "--workspace",
        str(workspace),
    )
    with open(log, "wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=recipe.parent, env=cli_env())


def _wait_all(procs: list[subprocess.Popen], logs: list[Path]) -> None:
    """Every worker to its end, however long a busy machine takes (pytest's timeout is the hang guard);
    whatever ends the wait, no worker is left running."""
    try:
        for proc, log in zip(procs, logs):
            proc.wait()
            assert proc.returncode == 0, f"worker exited {proc.returncode}:\n{log.read_text()[-3000:]}"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _children(tracking_uri: str, experiment: str = "mini"):
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("ablate.role") == "sweep"]
    return client, parents, [r for r in runs if r.data.tags.get("ablate.role") != "sweep"]


def _enqueue(recipe: Path, storage: str, tracking_uri: str, workspace: Path, capsys) -> str:
    """`ablate sweep --no-train` (in this process: the imports are paid once for the whole session)."""
    code = main(
        [
            "sweep",
            str(recipe),
            "--storage",
            storage,
            "--tracking-uri",
            tracking_uri,
            "--no-train",
            "--yes",
            "--workspace",
            str(workspace),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_three_workers_on_postgres_run_each_trial_once_and_log_to_the_server(
    tmp_path, postgres, mlflow_server, capsys
):
    storage = postgres.create_database("study_three")
    experiment = "three"  # its own MLflow experiment on the shared server
    recipe = write_recipe(
        tmp_path, filename=f"{experiment}.yaml", name=experiment, seeds=[0, 1, 2], base__train__log_every=4
    )
    assert "6 trials enqueued" in _enqueue(recipe, storage, mlflow_server.url, tmp_path / "enqueue", capsys)
    assert not list((tmp_path / "enqueue").glob("runs/*"))  # --no-train trained nothing here

    # Three "machines": separate workspaces (no shared files), one study and one tracking server.
    logs = [tmp_path / f"worker{i}.log" for i in range(3)]
    procs = [
        _start_worker(recipe, storage, mlflow_server.url, tmp_path / f"machine{i}", log)
        for i, log in enumerate(logs)
    ]
    _wait_all(procs, logs)

    study = _load_study(storage, experiment)
    trials = study.get_trials()
    assert len(trials) == 6, "a worker created a trial"  # workers only claim the enqueued ones
    per_plan = collections.Counter(t.user_attrs["plan"] for t in trials)
    assert len(per_plan) == 6 and set(per_plan.values()) == {1}
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert len({t.user_attrs["worker_pid"] for t in trials}) >= 2  # the work was shared
    trained = sum(int(log.read_text().split("[worker] trained ")[1].split()[0]) for log in logs)
    assert trained == 6

    client, parents, children = _children(mlflow_server.url, experiment)
    assert len(parents) == 1 and len(children) == 6
    assert all(c.info.status == "FINISHED" for c in children)
    assert len({c.data.tags["ablate.run_key"] for c in children}) == 6
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert {t.user_attrs["mlflow_run_id"] for t in trials} == {c.info.run_id for c in children}
    # Artifacts went through the server into its folder, not into the workers' workspaces.
    for child in children:
        names = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert {"resolved_recipe.yaml", "final_metrics.json"} <= names
    assert len(list(mlflow_server.artifacts.rglob("final_metrics.json"))) >= 6
    assert not any((tmp_path / f"machine{i}" / "artifacts").exists() for i in range(3))

    assert (
        main(
            [
                "report",
                str(recipe),
                "--storage",
                storage,
                "--tracking-uri",
                mlflow_server.url,
                "--workspace",
                str(tmp_path / "enqueue"),
                "--reports",
                str(tmp_path / "rep"),
            ]
        )
        == 0
    )
    assert "Diff Transformer" in (tmp_path / "rep" / experiment / "table.md").read_text()


def test_worker_killed_mid_trial_on_postgres_is_resumed_by_another(tmp_path, postgres, mlflow_server, capsys):
    storage = postgres.create_database("study_kill")
    experiment = "killed"
    recipe = write_recipe(
        tmp_path,
        filename=f"{experiment}.yaml",
        name=experiment,
        base__train__steps=30,
        base__train__val_every=2,
        base__train__log_every=3,
    )
    _enqueue(recipe, storage, mlflow_server.url, tmp_path / "ws", capsys)

    # One machine (a shared workspace), so the retry resumes from the dead worker's checkpoint; three
    # workers for two trials: when one is killed mid-trial, two race to notice, one re-enqueues its trial.
    workspace = tmp_path / "ws"
    logs = [tmp_path / f"worker{i}.log" for i in range(3)]
    procs = [_start_worker(recipe, storage, mlflow_server.url, workspace, log) for log in logs]
    victim = None
    watched = _load_study(storage, experiment)  # one storage (one connection pool) for the whole wait
    while victim is None:  # the event, however long a busy machine takes; pytest's timeout guards hangs
        for trial in watched.get_trials(states=(TrialState.RUNNING,)):
            folder = f"{trial.user_attrs.get('run_name')}-{trial.user_attrs.get('run_key')}"
            if list(workspace.glob(f"runs/*/{folder}/checkpoints/last.ckpt")):
                victim = trial
                break
        else:
            time.sleep(0.1)
    pid = victim.user_attrs["worker_pid"]
    os.kill(pid, signal.SIGKILL)
    killed = next(p for p in procs if p.pid == pid)
    killed.wait()
    survivors = [(p, log) for p, log in zip(procs, logs) if p is not killed]
    _wait_all([p for p, _ in survivors], [log for _, log in survivors])

    study = _load_study(storage, experiment)
    assert len(study.get_trials()) == 3  # two plans and the one retry
    states = collections.defaultdict(collections.Counter)
    for t in study.get_trials():
        states[t.user_attrs["plan"]][t.state] += 1
    assert len(states) == 2
    for plan, counts in states.items():
        assert counts[TrialState.COMPLETE] == 1, (plan, counts)
        assert counts[TrialState.RUNNING] == counts[TrialState.WAITING] == 0
    failed = [t for t in study.get_trials() if t.state == TrialState.FAIL]
    assert len(failed) == 1 and failed[0].number == victim.number
    assert failed[0].user_attrs["failure_reason"] == "worker died"
    retry = next(t for t in study.get_trials() if t.user_attrs.get("retry_of") == victim.number)
    killed_run = victim.user_attrs["mlflow_run_id"]
    assert retry.state == TrialState.COMPLETE and retry.user_attrs["mlflow_run_id"] == killed_run  # resumed
    assert retry.user_attrs["worker_pid"] != pid

    client, _, children = _children(mlflow_server.url, experiment)
    assert len(children) == 2 and all(c.info.status == "FINISHED" for c in children)
    assert len({c.data.tags["ablate.run_key"] for c in children}) == 2
    # The resumed run went on from its checkpoint: step 1 was logged by the first attempt, the last
    # step by the survivor.
    steps = [m.step for m in client.get_metric_history(killed_run, "train/loss")]
    assert min(steps) == 1 and max(steps) == 30
