"""A sweep on a real Slurm (the `slurm` fixture: munged, slurmctld and slurmd on loopback): 2 variants x 2
seeds as a 2-task job array; one task is sent the warning signal mid-trial and requeues itself, the other
is cancelled outright later. Every trial finishes exactly once, the warned trial resumes from the
checkpoint it saved at the signal (its logged steps go on from there, none twice), and the report's
numbers equal a local run's. Every wait is for an event; pytest's timeout is the hang guard. The trials wait
at a gate mid-run (slurm_gate.py, imported by the recipe) until their task is warned or the gate opens, so a
fast machine cannot finish a trial before its task is signalled or cancelled."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from scaleout_helpers import run_cli, write_recipe

from ablate.store.stores import Stores

pytestmark = pytest.mark.scaleout

STEPS, VAL_EVERY = 60, 20


def _study(workspace: Path):
    return optuna.load_study(study_name="mini", storage=Stores(workspace).storage())


def _wait_for(
    what: str, found, array: str | None = None, logs: Path | None = None, poll_s: float = 0.2, slurm=None
):
    """found() until it returns something: an event, however long a busy machine takes; the array's jobs
    ending first fails the test with their logs and the controller's. Whether they had ended is read
    before found() looks, so jobs that end between the two (the last trial told, then the workers gone)
    are not taken for jobs that ended early."""
    while True:
        ended = array is not None and _ended(array)
        value = found()
        if value:
            return value
        if ended:
            shown = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(logs.glob("*_log.*")))
            if slurm is not None:
                shown += f"\n--- slurmctld.log\n{(slurm.folder / 'slurmctld.log').read_text()[-6000:]}"
            raise AssertionError(f"the Slurm jobs ended before {what}:\n{shown}")
        time.sleep(poll_s)


def _at_gate(gate: Path, exclude: str | None = None) -> str | None:
    """The Slurm task (array job_task) of a trial waiting at the gate, other than `exclude`."""
    return next((p.stem for p in sorted(gate.glob("*.waiting")) if p.stem != exclude), None)


def _running_in(study, job: str):
    """The running trial of Slurm task `job`, once its MLflow run is recorded."""
    return next(
        (
            t
            for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if t.user_attrs.get("slurm_job") == job and t.user_attrs.get("mlflow_run_id")
        ),
        None,
    )


# A job's final states (a task being requeued, REQUEUED, is not one, nor is a held one).
FINAL = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
         "PREEMPTED", "REVOKED"}  # fmt: skip


def _ended(job: str) -> bool:
    """Every task of `job` in a final state (or gone from the controller); a failed squeue (a busy
    slurmctld: its output is empty) is not read as the jobs ended."""
    done = subprocess.run(
        ["squeue", "--noheader", "--states=all", "--format=%T", "--jobs", job], capture_output=True, text=True
    )
    return done.returncode == 0 and all(state in FINAL for state in done.stdout.split())


def _table(folder: Path) -> list[tuple[str, str, str]]:
    return sorted((r["variant"], r["seed"], r["valid"]) for r in csv.DictReader(open(folder / "table.csv")))


def test_a_sweep_on_slurm_survives_a_preemption_and_a_cancel(slurm, tmp_path, monkeypatch):
    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv("ABLATE_TEST_GATE", str(gate))  # sbatch hands this environment to the tasks
    here = str(Path(__file__).parent)  # slurm_gate, which the recipe imports
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    recipe = write_recipe(
        tmp_path,
        seeds=[0, 1],
        imports=["slurm_gate"],
        base__train__steps=STEPS,
        base__train__val_every=VAL_EVERY,
    )
    workspace = tmp_path / "ablate-runs"
    args = ("sweep", str(recipe), "--launcher", "slurm", "--workers", "2", "--yes", "--reports", "rep")
    out = run_cli(*args, cwd=tmp_path, check=True).stdout
    array = re.search(r"submitted Slurm job array (\d+)", out).group(1)  # returns once submitted

    client = Stores(workspace).client()
    study = _study(workspace)
    jobs = dict(array=array, logs=workspace / "slurm" / array, slurm=slurm)
    warned_task = _wait_for("a trial at the gate", lambda: _at_gate(gate), **jobs)
    warned = _wait_for("its trial", lambda: _running_in(study, warned_task), **jobs)
    subprocess.run(["scancel", "--signal=USR2", warned_task], check=True)
    # Slurm starts the requeued task itself once its credentials expire (the test cluster's cred_expire);
    # started sooner by hand, slurmd refuses it and the task ends FAILED (conftest.SLURM_CONF).
    handed_back = _wait_for(
        "the warned trial handed back",
        lambda: (
            study.get_trials(deepcopy=False)[warned.number].state == TrialState.FAIL
            and study.get_trials(deepcopy=False)[warned.number]
        ),
        **jobs,
    )
    assert handed_back.user_attrs["failure_reason"].startswith("preempted"), handed_back.user_attrs
    saved_at = handed_back.user_attrs["preempted_at"]  # the step the signal's checkpoint was saved at
    assert 0 < saved_at < STEPS

    other = _wait_for("the other task's trial at the gate", lambda: _at_gate(gate, warned_task), **jobs)
    subprocess.run(["scancel", other], check=True)  # no warning: its trial is retried through liveness
    (gate / "open").touch()  # the trials left, and the retries, train through

    def finished() -> bool:
        trials = study.get_trials(deepcopy=False)
        plans = {t.user_attrs["plan"] for t in trials}
        return all(
            any(t.user_attrs["plan"] == p and t.state == TrialState.COMPLETE for t in trials) for p in plans
        )

    _wait_for("every trial finished", finished, **jobs, poll_s=1.0)
    _wait_for("the array ended", lambda: _ended(array), poll_s=1.0)

    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 4 and len({t.user_attrs["plan"] for t in complete}) == 4  # each exactly once
    retry = next(t for t in complete if t.user_attrs["plan"] == warned.user_attrs["plan"])
    assert retry.user_attrs["mlflow_run_id"] == warned.user_attrs["mlflow_run_id"]  # the same MLflow run
    steps = [m.step for m in client.get_metric_history(retry.user_attrs["mlflow_run_id"], "train/loss")]
    assert sorted(steps) == list(range(1, STEPS + 1)), steps  # went on from the checkpoint: no step twice
    resumed = (workspace / "slurm" / array).glob("*_log.out")
    assert any(f"checkpoint at step {saved_at}" in p.read_text() for p in resumed)

    run_cli("report", str(recipe), "--reports", "rep", cwd=tmp_path, check=True)
    local = tmp_path / "local"
    run_cli(
        *args[:2],
        "--yes",
        "--workspace",
        str(local),
        "--reports",
        str(local / "rep"),
        cwd=tmp_path,
        check=True,
    )
    assert _table(tmp_path / "rep" / "mini") == _table(local / "rep" / "mini")
