"""`train.strategy: fsdp` (FSDP2 per decoder block and at the root, through Lightning's ModelParallelStrategy)
on the CPU: 2 gloo processes follow one process's losses, in float32 for the Transformer, Diff and Diff V2;
bf16-true and bf16-mixed train and stay near float32; activation checkpointing changes no loss; a sharded
checkpoint (one shard per rank) resumes a run killed with SIGKILL on 2 ranks and on 1, and starts a
budget's cooldown branch; the probes read it gathered.

Tolerances. Float32, 2 ranks against 1: each optimizer step sees the same micro-batches; only the order of
the float32 additions of the gradients differs (ranks reduce-scatter their sums), a few ulps that AdamW
carries through 20 steps: measured 4.8e-7 on the training loss (as DDP's, tests/scaleout/test_ddp.py).
TOLERANCE = 1e-5. A resumed run repeats the steps it would have taken: its losses after the checkpoint
equal the uninterrupted run's to EXACT = 1e-6 (measured 0 on the same ranks; 4.8e-7 on 1 rank after 2,
the same reordering). bf16: one device in bf16 measured 0.043 (bf16-true) and 0.011 (bf16-mixed) from
float32 over these 20 steps; BF16_TOLERANCE = 0.1, while training moves the loss by 1.8.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from scaleout_helpers import run_cli, training_until_a_checkpoint, write_recipe

from ablate.core.workspace import Workspace
from ablate.recipe.loading import load_recipe
from ablate.store import names
from ablate.store.stores import Stores
from ablate.train import checkpoint_files
from ablate.train.resume import resume_point, run_dir

pytestmark = [pytest.mark.scaleout, pytest.mark.xdist_group("fsdp")]

TOLERANCE, EXACT, BF16_TOLERANCE = 1e-5, 1e-6, 0.1
STEPS = 20
TRAIN = {
    "steps": STEPS,
    "val_every": 4,
    "val_batches": 4,
    "batch_tokens": 512,
    "log_every": 1,
    "accelerator": "cpu",
}
FSDP = {"devices": 2, "strategy": "fsdp"}
VARIANTS = {
    "transformer": {"label": "Transformer", "model": {"attention": {"name": "softmax"}}},
    "diff": {"label": "Diff Transformer", "model": {"attention": {"name": "diff"}}},
    "diff_v2": {"label": "Diff V2", "model": {"attention": {"name": "diff_v2"}}},
}
KEYS = ("train/loss", "val/loss", "grad_norm")


def _recipe(folder: Path, filename: str, **train) -> Path:
    return write_recipe(
        folder,
        filename=filename,
        variants=VARIANTS,
        **{f"base__train__{k}": v for k, v in {**TRAIN, **train}.items()},
    )


def _train(recipe: Path, variant: str, workspace: Path, *overrides: str) -> None:
    run_cli(
        "train", str(recipe), "--variant", variant, "--workspace", str(workspace), *overrides,
        cwd=recipe.parent, check=True,
    )  # fmt: skip


def _history(workspace: Path) -> tuple[object, dict[str, dict[int, float]]]:
    """The workspace's one MLflow run and its metrics, {key: {step: last value logged}}."""
    client = Stores(workspace).client()
    runs = client.search_runs([client.get_experiment_by_name("mini").experiment_id])
    assert len(runs) == 1, f"{len(runs)} MLflow runs: only global rank 0 may open one"
    metrics = {}
    for key in KEYS:
        ordered = sorted(client.get_metric_history(runs[0].info.run_id, key), key=lambda m: m.timestamp)
        metrics[key] = {m.step: m.value for m in ordered}
    return runs[0], metrics


def _worst(a: dict[int, float], b: dict[int, float], steps) -> float:
    return max(abs(a[s] - b[s]) for s in steps)


def _killed_after_a_checkpoint(recipe: Path, variant: str, workspace: Path) -> int:
    """Train, SIGKILL the launching process (rank 0) once a checkpoint is whole; the checkpoint's step."""
    with training_until_a_checkpoint(recipe, variant, workspace) as proc:  # then rank 1 killed too
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    (last,) = workspace.glob("runs/*/*/checkpoints/last.ckpt")
    return checkpoint_files.step(last)


class Trained:
    """The module's runs, each trained the first time a test asks for it (so each test's time holds only
    the runs it adds): `histories[name]` is (MLflow run, metrics) of the workspace `folder / name`."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.single, self.fsdp = _recipe(folder, "single.yaml"), _recipe(folder, "fsdp.yaml", **FSDP)
        self.histories: dict[str, tuple[object, dict[str, dict[int, float]]]] = {}
        self.steps: dict[str, int] = {}

    def __call__(self, name: str) -> tuple[object, dict[str, dict[int, float]]]:
        if name not in self.histories:
            self._train(name)
            self.histories[name] = _history(self.folder / name)
        return self.histories[name]

    def _train(self, name: str) -> None:
        workspace = self.folder / name
        kind, _, rest = name.partition("-")
        if kind in ("single", "fsdp"):  # single-VARIANT, fsdp-VARIANT: float32
            _train(self.single if kind == "single" else self.fsdp, rest, workspace)
        elif kind == "bf16":  # bf16-true, bf16-mixed: fsdp Diff
            _train(self.fsdp, "diff", workspace, f"--base.train.precision={name}")
        elif name == "recompute":  # fsdp Diff recomputing its blocks, killed and resumed on 2 ranks
            recipe = _recipe(self.folder, "recompute.yaml", **FSDP, activation_checkpointing=True)
            self.steps[name] = _killed_after_a_checkpoint(recipe, "diff", workspace)
            _train(recipe, "diff", workspace)
        elif name == "to-one-rank":  # fsdp Diff killed on 2 ranks, resumed on 1
            self.steps[name] = _killed_after_a_checkpoint(self.fsdp, "diff", workspace)
            _train(self.fsdp, "diff", workspace, "--base.train.devices=1")
        else:
            raise KeyError(name)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Trained:
    return Trained(tmp_path_factory.mktemp("fsdp"))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_two_fsdp_ranks_follow_one_process_in_float32(runs, variant):
    single_run, single = runs(f"single-{variant}")
    fsdp_run, fsdp = runs(f"fsdp-{variant}")
    assert single_run.info.status == fsdp_run.info.status == "FINISHED"
    assert fsdp_run.data.params["train.strategy"] == "fsdp" and fsdp_run.data.params["train.devices"] == "2"
    assert fsdp_run.data.tags[names.SHARDING] == "fsdp over 2 ranks (FSDP2 per block and root, 32-true)"
    assert single_run.data.tags[names.SHARDING] == "none"
    for key in KEYS:
        assert sorted(fsdp[key]) == sorted(single[key]), key
        worst = _worst(fsdp[key], single[key], single[key])
        assert worst < TOLERANCE * (10 if key == "grad_norm" else 1), (key, worst)
    assert (
        single["train/loss"][STEPS] < single["train/loss"][1] - 0.5
    )  # it learned: the comparison means something


@pytest.mark.parametrize("precision", ["bf16-true", "bf16-mixed"])
def test_bf16_under_fsdp_trains_near_float32(runs, precision):
    run, trained = runs(precision)
    _, float32 = runs("fsdp-diff")
    assert run.info.status == "FINISHED" and run.data.tags[names.PRECISION] == precision
    for key in ("train/loss", "val/loss"):
        worst = _worst(trained[key], float32[key], float32[key])
        assert worst < BF16_TOLERANCE, (key, worst)
    assert trained["train/loss"][STEPS] < trained["train/loss"][1] - 1.0


def test_recomputed_blocks_killed_and_resumed_on_two_ranks_give_the_same_losses(runs):
    """Activation checkpointing changes no number (EXACT), and a 2-rank run killed with SIGKILL resumes
    from its sharded checkpoint to the uninterrupted run's losses."""
    run, again = runs("recompute")
    step = runs.steps["recompute"]
    _, uninterrupted = runs("fsdp-diff")
    assert run.info.status == "FINISHED" and run.data.params["train.activation_checkpointing"] == "true"
    assert step <= STEPS - 10  # the next 10 losses at least came after the resume
    assert sorted(again["train/loss"]) == list(range(1, STEPS + 1))
    for key in KEYS:
        worst = _worst(again[key], uninterrupted[key], uninterrupted[key])
        assert worst < EXACT * (10 if key == "grad_norm" else 1), (key, worst)


def test_a_two_rank_checkpoint_resumes_on_one_rank(runs):
    """The run's key leaves out how many ranks compute it under fsdp: the same folder, the same MLflow
    run, its validations at the same steps, and the uninterrupted 2-rank run's losses."""
    run, again = runs("to-one-rank")
    step = runs.steps["to-one-rank"]
    _, uninterrupted = runs("fsdp-diff")
    assert run.info.status == "FINISHED" and step <= STEPS - 10
    assert run.data.tags[names.SHARDING] == "fsdp over 1 rank (FSDP2 per block and root, 32-true)"
    assert sorted(again["val/loss"]) == [4, 8, 12, 16, 20]  # Lightning's batch counts rescaled
    after = [s for s in uninterrupted["train/loss"] if s > step]
    assert len(after) >= 10
    for key in KEYS:
        worst = _worst(again[key], uninterrupted[key], [s for s in uninterrupted[key] if s > step])
        assert worst < EXACT * (10 if key == "grad_norm" else 1), (key, worst)


def test_the_key_leaves_out_fsdps_rank_count_and_recomputing_only(runs):
    def key(*overrides: tuple[str, object]) -> str:
        (run,) = load_recipe(runs.fsdp, overrides).resolve(variants=["diff"])
        return run.key

    two, one = key(), key(("base.train.devices", 1))
    assert two == one == key(("base.train.activation_checkpointing", True))
    ddp_two, ddp_one = (
        key(("base.train.strategy", "ddp")),
        key(("base.train.strategy", "ddp"), ("base.train.devices", 1)),
    )
    assert len({two, ddp_two, ddp_one}) == 3  # DDP's runs keep their devices in the key, as before


def test_a_sharded_checkpoint_is_one_shard_per_rank_and_gathers_to_the_probes_model(runs, tmp_path):
    """The 2-rank run's last checkpoint: a folder with one shard per rank; the probes' model (ablate eval)
    holds the weights torch's own converter gathers from it."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from ablate.probes.run import load_model

    runs("fsdp-diff")
    (run,) = load_recipe(runs.fsdp).resolve(variants=["diff"])
    workspace = Workspace(runs.folder / "fsdp-diff")
    last = run_dir(workspace, run) / "checkpoints" / "last.ckpt"
    assert sorted(p.name for p in last.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    dcp_to_torch_save(last, tmp_path / "whole.pt")
    whole = torch.load(tmp_path / "whole.pt", weights_only=True)["state_dict"]
    model = load_model(run, workspace, "last")
    got = model.state_dict()
    assert got.keys() == {k.removeprefix("model.") for k in whole if k.startswith("model.")}
    for name, tensor in got.items():
        assert torch.equal(tensor, whole[f"model.{name}"]), name


def test_a_kill_mid_swap_resumes_from_the_previous_whole_checkpoint(runs, tmp_path):
    """A sharded checkpoint is swapped in by two renames: killed between them, `last.ckpt` is gone and
    the old folder is whole under `last.ckpt.previous`; a half-written `last.ckpt.partial` is never read."""
    import shutil

    runs("fsdp-diff")
    (run,) = load_recipe(runs.fsdp).resolve(variants=["diff"])
    source = run_dir(Workspace(runs.folder / "fsdp-diff"), run) / "checkpoints"
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    shutil.copytree(source / "last.ckpt", checkpoints / "last.ckpt.previous")
    shutil.copytree(source / "last.ckpt", checkpoints / "last.ckpt.partial")
    (checkpoints / "last.ckpt.partial" / ".metadata").unlink()  # the shards half-written
    assert resume_point(checkpoints) == (STEPS, checkpoints / "last.ckpt.previous")
    shutil.rmtree(checkpoints / "last.ckpt.previous")
    assert resume_point(checkpoints) == (0, None)


def _budget_runs(workspace: Path) -> dict[str, dict[str, dict[int, float]]]:
    """{budget steps: metrics} of a workspace's runs (the longest and its branch)."""
    client = Stores(workspace).client()
    out = {}
    for run in client.search_runs([client.get_experiment_by_name("mini").experiment_id]):
        out[run.data.tags[names.BUDGET_STEPS]] = {
            key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
            for key in ("train/loss", "val/loss")
        }
    return out


def test_a_budget_branches_from_a_sharded_stable_checkpoint(tmp_path):
    """wsd with budgets 8 and 16 steps: under fsdp on 2 ranks the 8-step budget's cooldown starts from the
    sharded checkpoint of step 4 (a folder, one shard per rank), and its losses are the one-process run's,
    whose branch starts from a checkpoint file."""
    from ablate.train.branches import stable_checkpoint, stable_size

    budgets = {"schedule": "wsd", "cooldown_fraction": 0.5, "steps": 16}
    single = _recipe(tmp_path, "single.yaml", **budgets)
    fsdp = _recipe(tmp_path, "fsdp.yaml", **budgets, **FSDP)
    for recipe in (single, fsdp):
        text = recipe.read_text() + "budgets:\n  steps: [8, 16]\n"
        recipe.write_text(text)
        _train(recipe, "diff", tmp_path / recipe.stem)
    one, sharded = _budget_runs(tmp_path / "single"), _budget_runs(tmp_path / "fsdp")
    assert sorted(one) == sorted(sharded) == ["16", "8"]
    for budget in ("8", "16"):
        for key in ("train/loss", "val/loss"):
            assert sorted(sharded[budget][key]) == sorted(one[budget][key]), (budget, key)
            worst = _worst(sharded[budget][key], one[budget][key], one[budget][key])
            assert worst < EXACT, (budget, key, worst)
    assert sorted(sharded["8"]["train/loss"]) == list(range(5, 9))  # the branch trained its cooldown only
    (run,) = load_recipe(fsdp).resolve(variants=["diff"])
    workspace = Workspace(tmp_path / "fsdp")
    step, kept = stable_checkpoint(workspace, run)
    assert step == 8 and len(list(kept.glob("*.distcp"))) == 2  # the 16-step run's stable phase, sharded
    assert stable_size(workspace, [run]) == (1, sum(p.stat().st_size for p in kept.iterdir()))


def _mini_model(attention: str):
    from ablate.core import contract
    from ablate.model.decoder import build_model

    def build(folder: Path):
        model = build_model(load_recipe(_recipe(folder, "mini.yaml")).resolve(variants=[attention])[0].model)
        generator = torch.Generator().manual_seed(2)
        for block in model.blocks:  # zero at init (residual outputs): every gradient inside would be 0
            for name in contract.residual_out(block.attention):
                block.attention.get_parameter(name).data.normal_(0.0, 0.1, generator=generator)
        return model

    return build


@pytest.mark.parametrize("attention", ["diff", "diff_v2"])
def test_recomputed_blocks_give_the_same_loss_and_gradients(attention, tmp_path):
    """One process, no strategy: each block recomputed in the backward gives the loss and every gradient
    of the model that keeps its activations, and the same parameter names."""
    import torch.nn.functional as F

    from ablate.train.recompute import recompute_blocks

    build = _mini_model(attention)
    kept, recomputed = build(tmp_path), build(tmp_path)
    recompute_blocks(recomputed)
    tokens = torch.randint(0, 260, (4, 33), generator=torch.Generator().manual_seed(1))
    grads = []
    for model in (kept, recomputed):
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        grads.append((float(loss.detach()), {n: p.grad for n, p in model.named_parameters()}))
    (loss_kept, kept_grads), (loss_recomputed, recomputed_grads) = grads
    assert abs(loss_kept - loss_recomputed) < EXACT
    assert kept_grads.keys() == recomputed_grads.keys()
    for name, grad in kept_grads.items():
        torch.testing.assert_close(recomputed_grads[name], grad, rtol=0, atol=EXACT, msg=name)


def test_bf16_true_shards_keep_lambda_in_float32_in_its_own_group(tmp_path):
    """A gloo group of one process: under bf16-true every shard is bf16 but λ's vectors, which stay float32
    in groups of their own (FSDP2 refuses a group of mixed dtypes), and the model trains a step."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    from ablate.train.launch import free_port
    from ablate.train.sharding import kept_float32, shard

    model = _mini_model("diff")(tmp_path)
    assert kept_float32(model) == {
        f"blocks.{i}.attention.lambda_{w}{j}" for i in range(2) for w in "qk" for j in (1, 2)
    }
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        shard(model, init_device_mesh("cpu", (1,)), "bf16-true")
        dtypes = {name: p.dtype for name, p in model.named_parameters()}
        assert {n for n, d in dtypes.items() if d == torch.float32} == kept_float32(model)
        assert {d for n, d in dtypes.items() if "lambda" not in n} == {torch.bfloat16}
        assert isinstance(model.blocks[0].attention, FSDPModule) and isinstance(model.blocks[0], FSDPModule)
        tokens = torch.randint(0, 260, (2, 33), generator=torch.Generator().manual_seed(1))
        F.cross_entropy(model(tokens[:, :-1]).float().flatten(0, 1), tokens[:, 1:].flatten()).backward()
        lambdas = [p for n, p in model.named_parameters() if n in kept_float32(model)]
        assert {p.grad.dtype for p in lambdas} == {torch.float32}
        assert sum(float(p.grad.to_local().abs().sum()) for p in lambdas) > 0  # λ learns
    finally:
        dist.destroy_process_group()
