"""One sweep per study, one trainer per run folder, and a worker that lost its trial stops: real processes
(holders started as their own interpreters, killed with SIGKILL), the real Optuna journal and MLflow store
of a workspace under tmp_path."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import optuna
import pytest
from mini_project import one_line_refusal, write_recipe
from optuna.trial import TrialState

from ablate.cli import main
from ablate.core.errors import UserError
from ablate.core.workspace import Workspace
from ablate.store.stores import Stores
from ablate.store.study import SWEEP_LOCK_SUFFIX, open_study
from ablate.sweep import queue
from ablate.sweep.lock import SweepLock
from ablate.verbs.options import Shared, grace_period_checked, sweep_context


def _holder(script: str, *args: str) -> subprocess.Popen:
    """A process running `script` (its argv after it: `args`) that prints `held` once it holds, then waits."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    line = proc.stdout.readline()
    assert line.strip() == "held", (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


SWEEP_HOLDER = """
    import sys, time
    from ablate.store.study import open_study
    from ablate.verbs.options import Shared, grace_period_checked, sweep_context
    from ablate.verbs.sweep import hold_sweep

    ctx = sweep_context(sys.argv[1], Shared(workspace=sys.argv[2]), None, 60.0, None)
    _, storage = open_study(ctx)
    with hold_sweep(ctx, storage):
        print("held")
        time.sleep(600)
"""


def test_a_second_sweep_on_a_running_study_is_refused_and_a_dead_holder_does_not_block(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    workspace = tmp_path / "ws"
    argv = ["sweep", str(recipe), "--workspace", str(workspace), "--yes", "--reports", str(tmp_path / "rep")]
    holder = _holder(SWEEP_HOLDER, str(recipe), str(workspace))
    try:
        code = main([*argv, "--no-train"])
        one_line_refusal(
            capsys, code, f"host {socket.gethostname()}, pid {holder.pid}", "`ablate worker ", "mini"
        )
    finally:
        _kill(holder)
    ctx = sweep_context(str(recipe), Shared(workspace=str(workspace)), None, 60.0, None)
    study, storage = open_study(ctx)
    assert study.get_trials() == []  # the refused sweep enqueued nothing
    # the holder was killed (same host, pid gone): its lock does not block the next sweep
    assert main([*argv, "--no-train"]) == 0
    assert len(study.get_trials(states=(TrialState.WAITING,))) == 2
    names = optuna.get_all_study_names(storage)
    assert names == ["mini"], names  # the lock went with the sweep that held it
    assert not (tmp_path / "rep").exists()


def test_a_lock_of_another_host_blocks_while_its_heartbeat_is_fresh(tmp_path):
    storage = Stores(tmp_path / "ws").storage()
    from optuna.study import StudyDirection

    def lock_of_elsewhere(beat_age: float) -> None:
        sid = storage.create_new_study([StudyDirection.MINIMIZE], "s" + SWEEP_LOCK_SUFFIX)
        for key, value in {"host": "elsewhere", "pid": 1, "heartbeat": time.time() - beat_age}.items():
            storage.set_study_user_attr(sid, key, value)

    lock_of_elsewhere(beat_age=1.0)
    with pytest.raises(UserError, match=r"host elsewhere, pid 1, heartbeat 1 s ago"):
        SweepLock(storage, "s", grace_period=60.0)
    storage.delete_study(storage.get_study_id_from_name("s" + SWEEP_LOCK_SUFFIX))
    lock_of_elsewhere(beat_age=61.0)  # past the grace period: its holder is gone
    with SweepLock(storage, "s", grace_period=60.0) as lock:
        assert storage.get_study_user_attrs(lock.study_id)["pid"] == os.getpid()
    assert optuna.get_all_study_names(storage) == []


FOLDER_HOLDER = """
    import sys, time
    from pathlib import Path
    from ablate.train.resume_lock import training

    with training(Path(sys.argv[1])):
        print("held")
        time.sleep(600)
"""


def test_two_processes_never_train_one_run_folder(tmp_path, capsys):
    from ablate.recipe.loading import load_recipe
    from ablate.train.resume import run_dir

    recipe = write_recipe(tmp_path)
    workspace = tmp_path / "ws"
    (run,) = load_recipe(recipe, []).resolve(None, seeds=[0], variants=["transformer"])
    folder = run_dir(Workspace(workspace), run)
    argv = ["train", str(recipe), "--variant", "transformer", "--workspace", str(workspace)]
    holder = _holder(FOLDER_HOLDER, str(folder))
    try:
        code = main(argv)
        one_line_refusal(capsys, code, str(folder), f"host {socket.gethostname()}, pid {holder.pid}")
    finally:
        _kill(holder)
    assert sorted(p.name for p in folder.iterdir()) == [".training.lock"]  # nothing trained into it
    assert main(argv) == 0  # the holder is dead: the kernel let go of its lock
    assert (folder / "result.json").exists()


def test_grace_period_is_checked(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    for bad, says in [("-1", "at least 15"), ("5", "at least 15"), ("nan", "float"), ("inf", "")]:
        code = main(["sweep", str(recipe), "--grace-period", bad, "--workspace", str(tmp_path / "ws")])
        one_line_refusal(capsys, code, "--grace-period", says)
    with pytest.raises(UserError, match="^--grace-period: nan is not a number of seconds"):
        grace_period_checked(float("nan"))  # never stale: refused below the parser too
    assert not (tmp_path / "ws").exists()


HANDER = """
    import sys, time
    import optuna
    from optuna.trial import TrialState
    from ablate.store.stores import Stores
    from ablate.sweep.queue import recover_stale

    storage = Stores(sys.argv[1]).storage()
    study = optuna.load_study(study_name=sys.argv[2], storage=storage)
    print("held")
    while not any("mlflow_run_id" in t.user_attrs for t in study.get_trials(states=(TrialState.RUNNING,))):
        time.sleep(0.2)
    time.sleep(1.0)  # training
    # another worker's look after the grace period (0 here): the trial's heartbeat is too old
    print(recover_stale(study, storage, 0.0))
"""


def test_a_worker_whose_trial_was_handed_away_stops_training_it(tmp_path, capsys, monkeypatch):
    from ablate.sweep.queue import claim_waiting, enqueue_missing
    from ablate.sweep.worker import parent_run_id, run_trial
    from ablate.train.resume import run_dir
    from ablate.train.resume_lock import training

    monkeypatch.setattr(queue, "HEARTBEAT_SECONDS", 0.2)  # the heartbeat looks five times a second
    recipe = write_recipe(tmp_path)
    workspace = tmp_path / "ws"
    long = [("base.train.steps", 6000), ("base.train.val_every", 2000)]
    ctx = sweep_context(str(recipe), Shared(workspace=str(workspace)), None, 60.0, long)
    ctx.progress = False
    study, storage = open_study(ctx)
    enqueue_missing(study, ctx.plans())
    parent = parent_run_id(ctx, study)
    hander = _holder(HANDER, str(workspace), ctx.study_name)
    try:
        trial = claim_waiting(study, storage)
        run_trial(ctx, study, storage, trial, parent, workers=1)
        assert hander.wait(timeout=60) == 0
        assert hander.stdout.read().strip() == "1"
    finally:
        if hander.poll() is None:
            _kill(hander)
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if "stopped training" in x]
    assert f"trial {trial.number} is FAIL (worker died): another worker found it stale" in line
    trials = study.get_trials()
    assert trials[trial.number].state == TrialState.FAIL
    # handed back once, by the other worker: its retry and the other plan wait, nothing else
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    assert len(waiting) == 2 and sum(t.user_attrs.get("retry_of") == trial.number for t in waiting) == 1
    run = ctx.run_for_plan(ctx.plans()[0])
    folder = run_dir(Workspace(workspace), run)
    assert not (folder / "result.json").exists()  # it stopped, long before step 6000
    with training(folder):  # and let go of the run folder for the worker that trains it now
        pass


def test_final_is_refused_while_trials_of_the_study_wait(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    workspace = tmp_path / "ws"
    argv = ["sweep", str(recipe), "--workspace", str(workspace), "--yes", "--reports", str(tmp_path / "rep")]
    assert main([*argv, "--no-train"]) == 0  # enqueued for `ablate worker`s: two trials wait
    journal = (workspace / "optuna.journal").read_bytes()
    capsys.readouterr()
    one_line_refusal(
        capsys, main([*argv, "--final"]), "--final: study 'mini' has 2 trials waiting and 0 running"
    )
    assert (workspace / "optuna.journal").read_bytes() == journal  # nothing started, nothing changed
    assert not (tmp_path / "rep").exists()
