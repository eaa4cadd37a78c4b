"""`train.strategy: auto` decided by the memory plan (ablate.train.choices.strategy): one device trains
there, several train ddp where a replica fits the device and fsdp where it does not, as `decide` hands it
down; a plan that fits nowhere is one line, exit 2, from `ablate check` and from `ablate train` before its
workspace exists; and the paper's scale, planned on 80 GB cards, fits every row."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from cli_helpers import assert_one_line_error, run_cli
from mini_project import sweep_argv, write_recipe

from ablate.core.errors import UserError
from ablate.core.workspace import Workspace
from ablate.model.memory import GB, memory_plan
from ablate.recipe.loading import load_recipe
from ablate.train.choices.decided import Placement, decide
from ablate.train.choices.strategy import require_fit

N_LAYERS = 6  # deep enough that two blocks and the root unsharded are less than the replica's state


def _run(tmp_path, **changes):
    path = write_recipe(tmp_path, base__model__n_layers=N_LAYERS, **changes)
    (run,) = load_recipe(path).resolve(None, seeds=[0], variants=["transformer"])
    return run


def _plans(run):
    shape = {
        "precision": "32-true",
        "micro_batch_size": run.train.micro_batch_size,
        "seq_len": run.train.seq_len,
    }
    return memory_plan(run.model, **shape), memory_plan(run.model, shards=2, **shape)


def _between(low, high):
    return (low.total + high.total) / 2 / GB


def _decided(tmp_path, run):
    return decide(run, Workspace(tmp_path / "ws"), where=Placement("cpu", "32-true", "as requested"))


def test_auto_is_ddp_where_a_replica_fits_and_fsdp_where_it_does_not(tmp_path):
    probe = _run(tmp_path / "probe", base__train__devices=2)
    replica, sharded = _plans(probe)
    assert sharded.total < replica.total and sharded.params < replica.params
    roomy = _run(tmp_path / "roomy", base__train__devices=2)
    assert _decided(tmp_path / "roomy", roomy).train.strategy == "ddp"
    tight = _run(
        tmp_path / "tight", base__train__devices=2, base__train__gpu_memory_gb=_between(sharded, replica)
    )
    assert tight.train.strategy == "auto" and _decided(tmp_path / "tight", tight).train.strategy == "fsdp"
    one = _run(tmp_path / "one", base__train__gpu_memory_gb=_between(sharded, replica))
    assert _decided(tmp_path / "one", one).train.strategy == "auto"  # one device: Lightning's own
    named = _run(tmp_path / "named", base__train__devices=2, base__train__strategy="ddp")
    assert _decided(tmp_path / "named", named).train.strategy == "ddp"


def test_the_refusal_names_the_row_the_bytes_and_what_would_fit(tmp_path):
    probe = _run(tmp_path / "probe")
    replica, sharded = _plans(probe)
    limit = _between(sharded, replica)
    run = _run(tmp_path / "run", base__train__gpu_memory_gb=limit)
    with pytest.raises(UserError) as refused:
        require_fit("mini paper row transformer", run.model, run.train)
    line = str(refused.value)
    assert line.startswith(
        f"mini paper row transformer: {replica.total / GB:.2g} GB a GPU (one GPU, 32-true)"
    )
    assert f"of a {limit:g} GB device (train.gpu_memory_gb)" in line
    assert "fits with strategy fsdp on 2 devices" in line  # the only world that divides its batch
    # the largest smaller micro-batch that fits (of those dividing the batch: 2 and 1), by the plan
    halves = [
        m
        for m in (2, 1)
        if memory_plan(probe.model, precision="32-true", micro_batch_size=m, seq_len=32).total <= limit * GB
    ]
    assert (f"train.micro_batch_size {halves[0]}" in line) if halves else ("micro_batch_size" not in line)
    recomputed = memory_plan(
        probe.model, precision="32-true", micro_batch_size=4, seq_len=32, activation_checkpointing=True
    )
    assert ("train.activation_checkpointing true" in line) == (recomputed.total <= limit * GB)


def test_check_refuses_a_plan_that_fits_no_device_in_one_line(tmp_path):
    recipe = write_recipe(tmp_path, base__train__gpu_memory_gb=1e-6)
    proc = subprocess.run(
        [sys.executable, "-m", "ablate.cli", "check", str(recipe)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.stdout.count(": DOES NOT FIT") == 2
    assert_one_line_error(
        proc.returncode,
        proc.stderr,
        "mini ",
        " row transformer: ",
        "(and 1 more rows: diff)",
        "train.gpu_memory_gb",
    )


def test_train_refuses_a_plan_that_does_not_fit_before_its_workspace_exists(tmp_path, capsys):
    recipe = write_recipe(tmp_path, base__train__gpu_memory_gb=1e-6)
    workspace = tmp_path / "ws"
    code, _, err = run_cli(capsys, "train", str(recipe), "--variant", "diff", "--workspace", str(workspace))
    assert_one_line_error(code, err, " row diff: ", "a GPU (one GPU, 32-true) of a 1e-06 GB device")
    assert not workspace.exists()


def test_a_sweep_refuses_a_plan_that_does_not_fit_before_anything_trains(tmp_path, capsys):
    recipe = write_recipe(tmp_path, base__train__gpu_memory_gb=1e-6)
    code, out, err = run_cli(capsys, *sweep_argv(recipe, tmp_path))
    assert out.count(": DOES NOT FIT") == 2  # the plan printed, then one line
    assert_one_line_error(code, err, " row transformer: ", "(and 1 more rows: diff)")
    assert not (tmp_path / "ws" / "runs").exists() and not (tmp_path / "rep").exists()


ROW = re.compile(r"^  (\S+) \((\S+); (.+?)\): ([\d.]+)GB a GPU .*; ([\d,]+) GPU-hours$")


@pytest.mark.parametrize("native_bf16", ["0", "1"])
def test_check_plans_the_papers_scale_with_fsdp_where_a_replica_does_not_fit(native_bf16):
    """`ablate check recipes/scaling-size.yaml` (its default scale, the paper's): on 80 GB cards every row
    fits, fsdp for the rows whose replica does not, with the GPU-hours each takes; the cards run bf16
    whatever this CPU's bf16 is forced to."""
    proc = subprocess.run(
        [sys.executable, "-m", "ablate.cli", "check", "recipes/scaling-size.yaml"],
        capture_output=True,
        text=True,
        env={**os.environ, "ABLATE_NATIVE_BF16": native_bf16},
    )
    assert proc.returncode == 0, proc.stderr
    rows = [m.groups() for m in map(ROW.match, proc.stdout.splitlines()) if m]
    assert len(rows) == 10, proc.stdout
    sharded = {}
    for row, precision, why, per_gpu, hours in rows:
        assert precision == "bf16-mixed" and float(per_gpu) <= 80 and int(hours.replace(",", "")) > 0
        replica = re.fullmatch(r"fsdp on (\d+) GPUs: a replica needs (\d+) GB of the 80 GB", why)
        assert replica or re.fullmatch(r"ddp on 8 GPUs", why), why
        if replica:
            assert int(replica[2]) > 80
            sharded[row] = int(replica[1])
    assert sharded == {
        f"{arm}@{size}": 16 if size == "13.1B" else 8
        for arm in ("transformer", "diff")
        for size in ("1.4B", "6.8B", "13.1B")
    }
    assert "DOES NOT FIT" not in proc.stdout and "40% MFU of an H100" in proc.stdout
