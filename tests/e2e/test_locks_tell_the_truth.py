"""Locks tell the truth (ablate.sweep.lock): the `ablate worker` command a refused sweep prints runs as
printed (with the sweep's overrides), and a lock whose holder never wrote a heartbeat goes stale after the
grace period like any other. Real processes, the real Optuna journal and MLflow store of a workspace
under tmp_path.
"""

from __future__ import annotations

import re
import shlex
import socket
import subprocess
import sys
import time

import optuna
import pytest
from mini_project import cli_command, write_recipe
from optuna.study import StudyDirection
from optuna.trial import TrialState

from ablate.cli import main
from ablate.core.errors import UserError
from ablate.store.stores import Stores
from ablate.store.study import SWEEP_LOCK_SUFFIX
from ablate.sweep.lock import SweepLock


def _lock(storage, name: str, **attrs) -> None:
    sid = storage.create_new_study([StudyDirection.MINIMIZE], name + SWEEP_LOCK_SUFFIX)
    for key, value in attrs.items():
        storage.set_study_user_attr(sid, key, value)


def test_a_holder_that_never_wrote_a_heartbeat_goes_stale_after_the_grace_period(tmp_path):
    storage = Stores(tmp_path / "ws").storage()
    _lock(storage, "s", host="elsewhere", pid=1)  # killed between writing its name and its first beat
    with pytest.raises(UserError, match=r"host elsewhere, pid 1, no heartbeat written yet"):
        SweepLock(storage, "s", grace_period=0.5)
    time.sleep(0.6)  # the grace period passes after that first refusal
    with SweepLock(storage, "s", grace_period=0.5) as lock:
        assert storage.get_study_user_attrs(lock.study_id)["host"] == socket.gethostname()
    assert optuna.get_all_study_names(storage) == []


def test_the_worker_command_a_refused_sweep_prints_runs_as_printed(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    workspace = tmp_path / "ws"
    argv = ["sweep", str(recipe), "--workspace", str(workspace), "--yes", "--reports", str(tmp_path / "rep")]
    override = "--base.train.steps=2"
    assert main([*argv, "--no-train", override]) == 0  # the study's trials, enqueued with the override
    storage = Stores(workspace).storage()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a live sweep's pid
    try:
        _lock(storage, "mini", host=socket.gethostname(), pid=holder.pid, heartbeat=time.time())
        capsys.readouterr()
        assert main([*argv, override]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        printed = re.search(r"`(ablate worker [^`]*)`", err)
        assert printed and override in printed.group(1), err
        words = shlex.split(printed.group(1))
        proc = subprocess.run(
            cli_command(*words[1:]), cwd=tmp_path, capture_output=True, text=True, timeout=400
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "another version" not in proc.stderr
    finally:
        holder.kill()
        holder.wait()
    study = optuna.load_study(study_name="mini", storage=storage)
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE, TrialState.COMPLETE]


def _enqueued(tmp_path):
    """(recipe, workspace, Optuna storage) of the mini sweep enqueued (`--no-train`) in tmp_path."""
    recipe = write_recipe(tmp_path)
    workspace = tmp_path / "ws"
    argv = ["sweep", str(recipe), "--workspace", str(workspace), "--yes", "--reports", str(tmp_path / "rep")]
    assert main([*argv, "--no-train"]) == 0
    return recipe, workspace, Stores(workspace).storage()


def test_status_shows_a_dead_workers_trial_as_stale_and_names_the_locks_holder(tmp_path, capsys):
    recipe, workspace, storage = _enqueued(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a worker and a sweep killed with -9: their pid is gone
    study = optuna.load_study(study_name="mini", storage=storage)
    trial = study.get_trials(deepcopy=False)[0]
    tid = storage.get_trial_id_from_study_id_trial_number(study._study_id, trial.number)
    assert storage.set_trial_state_values(tid, state=TrialState.RUNNING)  # claimed by the dead worker
    beat = time.time() - 1247
    for key, value in {
        "worker_host": socket.gethostname(),
        "worker_pid": dead.pid,
        "heartbeat": beat,
    }.items():
        storage.set_trial_user_attr(tid, key, value)
    _lock(storage, "mini", host=socket.gethostname(), pid=dead.pid, heartbeat=beat)
    capsys.readouterr()
    assert main(["status", str(recipe), "--workspace", str(workspace), "--grace-period", "15"]) == 0
    out = capsys.readouterr().out
    assert "0 running, 1 stale (worker gone: its process ended)" in out, out
    (row,) = [line for line in out.splitlines() if line.startswith(f"| {trial.number} ")]
    assert f"| stale: process {dead.pid} on this host has ended " in row, out
    assert re.search(r"\| 12\d\d s ago", row), out  # 1247 s, and the test's own seconds
    (lock,) = [line for line in out.splitlines() if line.startswith("sweep lock:")]
    assert re.search(rf"pid {dead.pid}, heartbeat 12\d\d s ago; stale", lock), out


def test_the_stale_reason_agrees_with_the_table(tmp_path, capsys):
    """A worker killed with -9 six seconds after its last heartbeat: stale because its process ended (not
    for a heartbeat 60 s old, which the table would contradict); a worker on another host silent for
    longer than the grace period: stale for that, with the seconds the table shows."""
    recipe, workspace, storage = _enqueued(tmp_path)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    worker.kill()  # kill -9
    worker.wait()
    study = optuna.load_study(study_name="mini", storage=storage)
    now = time.time()
    claims = [
        {"worker_host": socket.gethostname(), "worker_pid": worker.pid, "heartbeat": now - 6},
        {"worker_host": "elsewhere", "worker_pid": 1, "heartbeat": now - 1247},
    ]
    for trial, attrs in zip(study.get_trials(deepcopy=False), claims, strict=True):
        tid = storage.get_trial_id_from_study_id_trial_number(study._study_id, trial.number)
        assert storage.set_trial_state_values(tid, state=TrialState.RUNNING)
        for key, value in attrs.items():
            storage.set_trial_user_attr(tid, key, value)
    capsys.readouterr()
    assert main(["status", str(recipe), "--workspace", str(workspace), "--grace-period", "60"]) == 0
    out = capsys.readouterr().out
    summary = out.splitlines()[0]
    assert "2 stale (worker gone: its process ended; no heartbeat past the grace period)" in summary, out
    killed, silent = (line for line in out.splitlines() if re.match(r"\| [01] ", line))
    assert f"stale: process {worker.pid} on this host has ended" in killed and re.search(
        r"\| [6-9] s ago", killed
    )
    assert "no heartbeat" not in killed, out  # its heartbeat is seconds old: the table and the reason agree
    seconds = re.search(r"no heartbeat for (\d+) s, over the grace period of 60 s", silent)
    assert seconds and re.search(rf"\| {seconds.group(1)} s ago", silent), out


def test_a_printed_worker_command_reads_back_every_value_it_prints(tmp_path, capsys):
    """The command printed on a lock refusal, parsed back by the CLI's own parser, gives the values the
    sweep was given (a bare `3e-4` string stays a string); and the words it is made of read back inf, -inf
    and NaN as floats, where JSON's `Infinity` and `NaN` read back as strings (no recipe key takes them,
    so they are read back without a sweep)."""
    from ablate.cli import parse_args
    from ablate.core.argv import override_argv
    from ablate.recipe.loading import parse_overrides

    recipe = write_recipe(tmp_path)
    workspace = tmp_path / "ws"
    argv = ["sweep", str(recipe), "--workspace", str(workspace), "--yes", "--reports", str(tmp_path / "rep")]
    overrides = ["--base.train.steps=2", "--base.data.val_fraction=0.25", "--variants.diff.label='3e-4'"]
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a live sweep's pid
    try:
        storage = Stores(workspace).storage()
        _lock(storage, "mini", host=socket.gethostname(), pid=holder.pid, heartbeat=time.time())
        capsys.readouterr()
        code = main([*argv, *overrides])
        err = capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    printed = re.search(r"`(ablate worker [^`]*)`", err)
    assert printed, err
    given = parse_args([*argv, *overrides])[2]
    read_back = parse_args(shlex.split(printed.group(1))[1:])[2]
    assert read_back == given and dict(read_back)["variants.diff.label"] == "3e-4", (given, read_back)

    values = [float("inf"), float("-inf"), float("nan"), 1e-5, "3e-4", "yes", None, {"a": [1, float("inf")]}]
    back = [v for _, v in parse_overrides(override_argv([(f"k{i}", v) for i, v in enumerate(values)]))]
    assert repr(back) == repr(values)  # repr: nan == nan is False, its text is the same


def test_status_reads_a_read_only_workspace(tmp_path, capsys):
    recipe, workspace, storage = _enqueued(tmp_path)
    study = optuna.load_study(study_name="mini", storage=storage)
    tid = storage.get_trial_id_from_study_id_trial_number(study._study_id, 0)
    storage.set_trial_state_values(tid, state=TrialState.RUNNING)  # its progress is read from MLflow
    storage.set_trial_user_attr(tid, "heartbeat", time.time())
    before = {p.name: p.stat().st_mtime_ns for p in workspace.iterdir()}
    subprocess.run(["mount", "--bind", str(workspace), str(workspace)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(workspace)], check=True)
        capsys.readouterr()
        code = main(["status", str(recipe), "--workspace", str(workspace)])
        out, err = capsys.readouterr()
    finally:
        subprocess.run(["umount", "-l", str(workspace)], check=True)
    assert code == 0, err
    assert "sweep mini: 0/2 trials finished, 1 running, 1 waiting" in out, out
    assert {p.name: p.stat().st_mtime_ns for p in workspace.iterdir()} == before  # nothing written


def test_report_reads_a_read_only_workspace_and_says_what_it_did_not_write(finished_sweep, tmp_path, capsys):
    (recipe,) = finished_sweep.parent.glob("*.yaml")
    before = {p.name: p.stat().st_mtime_ns for p in finished_sweep.iterdir()}
    subprocess.run(["mount", "--bind", str(finished_sweep), str(finished_sweep)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(finished_sweep)], check=True)
        capsys.readouterr()
        argv = ["report", str(recipe), "--workspace", str(finished_sweep), "--reports", str(tmp_path / "rep")]
        code = main([*argv, "--seeds", "0", "1"])
        out, err = capsys.readouterr()
    finally:
        subprocess.run(["umount", "-l", str(finished_sweep)], check=True)
    assert code == 0, err
    assert (tmp_path / "rep" / "mini" / "table.md").is_file(), out
    (line,) = [line for line in (out + err).splitlines() if "read-only" in line]
    assert str(finished_sweep) in line and "UI" in line, line
    assert {p.name: p.stat().st_mtime_ns for p in finished_sweep.iterdir()} == before  # nothing written
