"""One decision in one place: AdamW is built in one module (ablate.train.optimizer), training and the timed
step (ablate.train.choices.timed_step) update a model alike, and what `auto` times on CUDA is the run's own
step (model, optimizer groups, lr, precision, compile), whose tags then name what trained. CUDA is a
stand-in here: the attention choice's timer seam with injected timings, as in test_attention_choice.py."""

from __future__ import annotations

import ast
import sys
from dataclasses import replace
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch
from mini_project import write_recipe

from ablate.core.workspace import Workspace
from ablate.hardware.device import CpuOps
from ablate.model.config import ModelConfig
from ablate.model.decoder import build_model
from ablate.recipe.loading import load_recipe
from ablate.store import names
from ablate.train import records
from ablate.train.choices.decided import Placement, decide
from ablate.train.choices.timed_step import build_step, train_step
from ablate.train.config import TrainConfig
from ablate.train.module import LMModule

ROOT = Path(__file__).resolve().parents[2]
CARD = "NVIDIA H200|sm90|torch=2.11"


def test_adamw_is_constructed_in_one_place_of_the_product():
    """Every call of `AdamW(...)` (as a name or an attribute) in ablate/ and components/, read with ast."""
    calls = []
    for path in sorted([*(ROOT / "ablate").rglob("*.py"), *(ROOT / "components").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", None))
                if name == "AdamW":
                    calls.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert len(calls) == 1 and calls[0].startswith("ablate/train/optimizer.py:"), calls


MODEL = ModelConfig(
    vocab_size=64, d_model=16, n_layers=2, head_dim=8, attention="diff", attention_backend="sdpa"
)
MUP = {"name": "mup", "base_d_model": 8, "base_head_dim": 4, "base_n_layers": 2}
TRAIN = TrainConfig(
    seq_len=16, micro_batch_size=2, batch_tokens=32, steps=3, lr=1e-2, warmup_steps=2, weight_decay=0.1,
    grad_clip=0.05, precision="32-true", compile=False,
)  # fmt: skip


@pytest.mark.parametrize("parametrization", ["standard", "mup"])
def test_three_steps_of_training_and_of_the_timed_step_update_the_parameters_alike(parametrization):
    """A real Lightning Trainer fitting `LMModule` and the timed step, on the same three batches from the same
    initialisation: the same parameters after every step's clipping, AdamW update and lr schedule."""
    model = replace(MODEL, parametrization=MUP) if parametrization == "mup" else MODEL
    gen = torch.Generator().manual_seed(1)
    batches = [
        torch.randint(0, 64, (TRAIN.micro_batch_size, TRAIN.seq_len + 1), generator=gen) for _ in range(3)
    ]

    module = LMModule(build_model(model, seed=0), TRAIN, sink=None)
    initial = {k: v.detach().clone() for k, v in module.model.named_parameters()}
    trainer = L.Trainer(
        accelerator="cpu", devices=1, precision="32-true", max_steps=3, gradient_clip_val=TRAIN.grad_clip,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))

    step = build_step(model, TRAIN, "32-true", CpuOps(), seed=0)
    lrs = []
    for batch in batches:
        lrs.append([group["lr"] for group in step.optimizer.param_groups])
        train_step(replace(step, tokens=batch))
    trained = dict(module.model.named_parameters())
    timed = dict(step.model.named_parameters())
    assert trained.keys() == timed.keys() == initial.keys()
    for name, param in timed.items():
        torch.testing.assert_close(param, trained[name], rtol=1e-6, atol=1e-7, msg=name)
    assert all(not torch.equal(initial[k], trained[k]) for k in ("embed.weight", "lm_head.weight"))
    # the schedule the steps ran at, computed here: warmup over 2 steps, then linear decay to 0 at step 3
    peaks = [group["initial_lr"] for group in step.optimizer.param_groups]
    assert peaks[0] == TRAIN.lr and lrs == [[0.5 * p for p in peaks], peaks, peaks]
    assert [group["lr"] for group in step.optimizer.param_groups] == [0.0] * len(peaks)


def _optimizer_shape(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> list[tuple]:
    """Each group's lr, decay, eps, betas and the names of its parameters (by identity in `model`)."""
    names_of = {id(p): n for n, p in model.named_parameters()}
    return [
        (g["lr"], g["weight_decay"], g["eps"], tuple(g["betas"]), [names_of[id(p)] for p in g["params"]])
        for g in optimizer.param_groups
    ]


def test_auto_on_cuda_times_the_runs_own_step_and_its_tags_name_what_trained(tmp_path, monkeypatch):
    """Stand-in CUDA timings: every candidate timed is the run's model with the candidate's backend and its
    `train:` with the candidate's compiling, in the run's precision; the winner's configuration is what
    trains (the step built from it has the Trainer's optimizer groups and lr, compiled as the run
    compiles), and the run's tags name its backend and compiling, not `auto`'s rule."""
    recipe = write_recipe(tmp_path, base__model__attention_backend="auto", base__train__compile="auto")
    (run,) = load_recipe(recipe).resolve(None, seeds=[0], variants=["diff"])
    seen = []

    def timer(model, train, precision, device):
        seen.append((model, train, precision, device))
        return 0.010 if (model.attention_backend, train.compile) == ("sdpa_efficient", True) else 0.050

    where = Placement("cuda", "bf16-mixed", "a stand-in card")
    decided = decide(run, Workspace(tmp_path / "ws"), where=where, timer=timer, device_key=CARD)

    assert len(seen) == 8 and {(m.attention_backend, t.compile) for m, t, *_ in seen} == {
        (b, c) for b in ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "triton") for c in (False, True)
    }
    for model, train, precision, device in seen:  # the run's sections, but for the candidate's two fields
        assert replace(model, attention_backend="auto") == run.model
        assert replace(train, compile="auto") == run.train and (precision, device) == ("bf16-mixed", "cuda")
    winner = [s for s in seen if (s[0].attention_backend, s[1].compile) == ("sdpa_efficient", True)]
    assert winner == [(decided.model, decided.train, "bf16-mixed", "cuda")]
    assert decided.where == where and decided.train.compile is True

    step = build_step(decided.model, decided.train, decided.where.precision, CpuOps())  # not run: no CUDA
    assert isinstance(step.model, torch._dynamo.eval_frame.OptimizedModule)  # compiled, as the run
    module = LMModule(build_model(decided.model, seed=run.seed), decided.train, sink=None)
    trains_with = module.configure_optimizers()["optimizer"]
    assert _optimizer_shape(step.optimizer, step.model._orig_mod) == _optimizer_shape(
        trains_with, module.model
    )
    assert step.optimizer.param_groups[0]["lr"] == pytest.approx(run.train.lr / run.train.warmup_steps)

    monkeypatch.setattr(records, "machine_description", lambda device: f"a stand-in {device} card")
    tags = records.run_tags(run, decided)
    assert tags[names.ATTENTION_KERNEL] == "sdpa_efficient" and tags[names.COMPILED] == "true"
    assert tags[names.ATTENTION_CHOICE] == "sdpa_efficient+compile (fastest whole step, measured)"
    assert (tags[names.PRECISION], tags[names.MACHINE]) == ("bf16-mixed", "a stand-in cuda card")
    # tags read off the recipe instead would differ: `auto`'s rule, `compile: auto`, its float32
    assert records.run_attention_kernel(run.model, run.train.seq_len, where) != "sdpa_efficient"
    assert (run.train.compile, run.train.precision) == ("auto", "32-true")


def test_one_meta_build_per_run(tmp_path, monkeypatch):
    """A real run (two steps): its shape, cost and attention-kernel tags are read off one model built on
    `meta`; the only other build is the model that trains. Counted where every build of a model or of
    its blocks takes its components' builders (ablate.model.decoder.block_makers)."""
    import ablate.model.decoder as decoder
    from ablate.store.stores import Stores
    from ablate.train.run import train_run

    builds = []
    makers = decoder.block_makers

    def counted(config):  # called by a whole model's build and by `meta_blocks` (a cost's or shape's)
        meta = sys._getframe(1).f_code.co_name == "meta_blocks" or str(torch.get_default_device()) == "meta"
        builds.append("meta" if meta else "real")
        return makers(config)

    monkeypatch.setattr(decoder, "block_makers", counted)
    monkeypatch.setenv("ABLATE_NATIVE_BF16", "0")  # precision by rule: no timed step builds a model
    recipe = write_recipe(tmp_path, base__train__steps=2, base__train__val_every=2)
    (run,) = load_recipe(recipe).resolve(None, seeds=[0], variants=["diff"])
    train_run(run, Stores(tmp_path / "ws"), progress=False)
    assert sorted(builds) == ["meta", "real"], builds
