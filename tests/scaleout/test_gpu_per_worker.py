"""A device per worker: `--workers N` on a machine with GPUs gives each worker process its own
(CUDA_VISIBLE_DEVICES). This machine has no GPU: the count torch.cuda would report is stood in for at the
sweep's one seam (`ablate.sweep.local.gpu_count`); the workers themselves are real processes, and train on
CPU cores."""

from __future__ import annotations

import re

import pytest
from optuna.trial import TrialState
from scaleout_helpers import write_recipe

import ablate.sweep.local as sweep_local
from ablate.cli import main
from ablate.core.errors import UserError
from ablate.store.stores import Stores


def test_each_worker_gets_its_own_devices_and_a_ddp_trial_gets_several():
    assert sweep_local.worker_devices(4, 1, ["0", "1", "2", "3"]) == ["0", "1", "2", "3"]
    assert sweep_local.worker_devices(2, 2, ["0", "1", "2", "3"]) == ["0,1", "2,3"]
    # within the user's CUDA_VISIBLE_DEVICES
    assert sweep_local.worker_devices(2, 1, ["4", "6"]) == ["4", "6"]
    assert sweep_local.worker_devices(3, 1, []) == [None, None, None]  # no GPU: the CPU cores, shared
    with pytest.raises(UserError, match=r"--workers: 3 workers x 2 device\(s\) per trial need 6 GPUs, this "):
        sweep_local.worker_devices(3, 2, ["0", "1", "2", "3"])


@pytest.mark.scaleout
def test_four_local_workers_on_a_machine_with_four_gpus_train_on_four_devices(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sweep_local, "gpu_count", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    recipe = write_recipe(tmp_path, seeds=[0, 1], base__train__steps=2, base__train__val_every=2)
    workspace = tmp_path / "ws"
    args = ["sweep", str(recipe), "--workers", "4", "--yes", "--workspace", str(workspace)]
    assert main([*args, "--reports", str(tmp_path / "rep")]) == 0
    started = {}  # each worker's log names the devices it was given
    for log in sorted((workspace / "logs").glob("mini-worker*.log")):
        found = re.search(r"\[worker\] on \S+, devices (\S+)", log.read_text())
        assert found, log.read_text()[-2000:]
        started[log.name] = found.group(1)
    assert sorted(started.values()) == ["0", "1", "2", "3"], started
    import optuna

    study = optuna.load_study(study_name="mini", storage=Stores(workspace).storage())
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    assert len(trials) == 4
    device_of = {}  # a worker trains every trial it takes on its own devices
    for trial in trials:
        assert (
            device_of.setdefault(trial.user_attrs["worker_pid"], trial.user_attrs["devices"])
            == (trial.user_attrs["devices"])
        )
    assert len(set(device_of.values())) == len(device_of)
