"""A sweep worker of several Slurm tasks trains each trial across them (`launcher.slurm.tasks_per_node`): on
the one-node Slurm of the `slurm` fixture, a 1-task array of 2 tasks per worker runs a 2-process CPU DDP
trial and a 2-process fsdp trial (gloo) through Lightning's SLURMEnvironment. Each trial finishes once,
its one MLflow run trained on 2 devices, the second task trained it as rank 1, and its losses equal a
local 2-process DDP run's. Several
nodes take the same path (SLURM_PROCID over all nodes) but only several tasks on one node are tested here.
Every wait is for an event; pytest's timeout is the hang guard."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import mlflow
import optuna
import pytest
from optuna.trial import TrialState
from scaleout_helpers import run_cli, write_recipe

from ablate.core.errors import UserError
from ablate.core.launcher import SlurmOptions
from ablate.recipe.loading import load_recipe
from ablate.store.stores import Stores
from ablate.store.study import SweepContext
from ablate.sweep.slurm import check_tasks

pytestmark = pytest.mark.scaleout

TOLERANCE = 1e-4  # tests/scaleout/test_ddp.py: the same 2-process split, launched two ways
TRAIN = {"steps": 12, "val_every": 4, "val_batches": 4, "batch_tokens": 512, "log_every": 1}
DDP = {"accelerator": "cpu", "devices": 2, "strategy": "ddp"}


def _squeue(job: str) -> str:
    return subprocess.run(["squeue", "--noheader", "--jobs", job], capture_output=True, text=True).stdout


def _losses(workspace: Path) -> dict[str, tuple[object, dict[str, dict[int, float]]]]:
    """{run name: (MLflow run, its metrics)} of the workspace's runs."""
    client = mlflow.MlflowClient(Stores(workspace).mlflow_uri())
    experiment = client.get_experiment_by_name("mini")
    out = {}
    for run in client.search_runs([experiment.experiment_id]):
        if run.data.tags.get("ablate.role") == "sweep":
            continue
        history = {
            key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
            for key in ("train/loss", "val/loss")
        }
        assert run.info.run_name not in out, (
            f"two MLflow runs of {run.info.run_name}: only task 0 may open one"
        )
        out[run.info.run_name] = (run, history)
    return out


def test_a_worker_of_two_slurm_tasks_trains_its_trials_as_two_process_ddp_and_fsdp(slurm, tmp_path):
    """Two trials: Diff under ddp and Diff under fsdp (FSDP2, a shard per task), each trained across the
    worker's 2 tasks; the fsdp trial's losses are the ddp trial's (the same split of the same batches)."""
    recipe = write_recipe(
        tmp_path,
        variants={
            "diff": {"label": "Diff Transformer", "model": {"attention": {"name": "diff"}}},
            "diff_fsdp": {
                "label": "Diff Transformer (fsdp)",
                "model": {"attention": {"name": "diff"}},
                "train": {"strategy": "fsdp"},
            },
        },
        **{f"base__train__{k}": v for k, v in {**TRAIN, **DDP}.items()},
    )
    workspace = tmp_path / "ablate-runs"
    args = ("sweep", str(recipe), "--launcher", "slurm", "--workers", "1", "--yes")
    out = run_cli(*args, "--launcher.slurm.tasks_per_node", "2", cwd=tmp_path, check=True).stdout
    array = re.search(r"submitted Slurm job array (\d+)", out).group(1)
    logs = workspace / "slurm" / array
    while _squeue(array).strip():  # the worker runs its trials, then stops: an event
        time.sleep(0.5)
    shown = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(logs.glob("*_log.*")))

    study = optuna.load_study(study_name="mini", storage=Stores(workspace).storage())
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2, shown  # each trial ran once
    assert "training diff-s0" in shown and "training diff_fsdp-s0" in shown  # task 1 trained each as its rank
    runs = _losses(workspace)
    assert sorted(runs) == ["diff-s0", "diff_fsdp-s0"]
    for name, strategy in (("diff-s0", "ddp"), ("diff_fsdp-s0", "fsdp")):
        run, losses = runs[name]
        assert run.info.status == "FINISHED"
        assert run.data.params["train.devices"] == "2" and run.data.params["train.strategy"] == strategy
        assert sorted(losses["train/loss"]) == list(range(1, TRAIN["steps"] + 1))
    assert runs["diff_fsdp-s0"][0].data.tags["ablate.sharding"].startswith("fsdp over 2 ranks")
    (last,) = workspace.glob("runs/*/diff_fsdp-s0-*/checkpoints/last.ckpt")
    assert sorted(p.name for p in last.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]  # a shard a task

    local = tmp_path / "local"
    run_cli("train", str(recipe), "--variant", "diff", "--workspace", str(local), cwd=tmp_path, check=True)
    _, local_losses = _losses(local)["diff-s0"]
    for name in ("diff-s0", "diff_fsdp-s0"):
        _, slurm_losses = runs[name]
        for key in ("train/loss", "val/loss"):
            assert sorted(slurm_losses[key]) == sorted(local_losses[key]), (name, key)
            worst = max(abs(slurm_losses[key][s] - local_losses[key][s]) for s in local_losses[key])
            assert worst < TOLERANCE, (name, key, worst)


def test_tasks_per_worker_must_match_each_runs_ddp_processes(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path, base__train__devices=2, base__train__accelerator="cpu"), [])
    ctx = SweepContext(recipe=recipe, scale=recipe.scale, seeds=[0], stores=Stores(tmp_path / "ws"))
    check_tasks(ctx, SlurmOptions(tasks_per_node=2))
    with pytest.raises(
        UserError, match=r"^launcher.slurm.tasks_per_node: 2 tasks on each of 2 node\(s\) per"
    ):
        check_tasks(ctx, SlurmOptions(tasks_per_node=2, nodes_per_worker=2))
    check_tasks(ctx, SlurmOptions())  # one task per worker: a trial's processes are spawned by ablate
