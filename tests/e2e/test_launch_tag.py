"""A run's tags name the `triton` launch configurations it trained with (`ablate.triton_launch`): a real
Lightning Trainer and MLflow store on the CPU, with a stand-in kernel that launches the way the triton op
does on CUDA, `run(chooser().choose(key, run))` (components/attention/triton/op.py `_launch`), from a
stand-in of the chooser's workspace cache (a configuration stored there by an earlier run on a card)."""

from __future__ import annotations

import json
from dataclasses import astuple

import torch
from mini_project import write_recipe

from ablate.core.workspace import Workspace
from ablate.model import kernels
from ablate.recipe.loading import load_recipe
from ablate.store import names
from ablate.store.stores import Stores
from ablate.train.choices.decided import decide
from ablate.train.run import train_run
from components.attention.triton import configs

STAND_IN = '''
import torch
from ablate.core.registry import register
from components.attention.softmax import SoftmaxAttention
from components.attention.triton import configs

LAUNCHED = []  # the configuration of every launch, as the kernel received it


@register("attention", "launching_stand_in")
class LaunchingStandIn(SoftmaxAttention):
    """Softmax attention that first launches a stand-in `forward` kernel through the chooser, as the triton
    op launches its kernels on CUDA."""

    def forward(self, x, **kwargs):
        key = configs.Key("forward", 1, self.head_width, self.head_width, x.dtype, x.shape[1], (9, 0))
        launch = LAUNCHED.append
        launch(configs.chooser().choose(key, launch))
        return super().forward(x, **kwargs)
'''


def _label(config: configs.Config) -> str:
    return f"{config.block_m}x{config.block_n} w{config.num_warps} s{config.num_stages}"


def test_the_tag_is_the_configuration_the_kernel_launched_with(tmp_path, monkeypatch):
    (tmp_path / "launch_stand_in.py").write_text(STAND_IN)
    monkeypatch.syspath_prepend(str(tmp_path))
    variants = {
        "stand_in": {"label": "Stand-in", "model": {"attention": {"name": "launching_stand_in"}}},
        "transformer": {"label": "Transformer", "model": {"attention": {"name": "softmax"}}},
    }
    recipe = write_recipe(tmp_path, variants=variants, imports=["launch_stand_in"])
    workspace = tmp_path / "ws"
    runs = {r.variant: r for r in load_recipe(recipe).resolve(None, seeds=[0])}
    key = configs.Key("forward", 1, 8, 8, torch.float32, 32, (9, 0))  # the mini model: heads of 8, 32 tokens
    stored = configs.candidates("forward", torch.float32, 8)[1]  # not the first: no default's by chance
    cache = Workspace(workspace).kernel_configs
    cache.mkdir(parents=True)
    (cache / configs.FILE).write_text(json.dumps({key.name(): {"config": list(astuple(stored)), "ms": {}}}))

    def no_timing(run):
        raise AssertionError("timed what the workspace's cache holds")

    previous = configs.use(configs.Chooser(timer=no_timing))
    try:
        stand_in = train_run(runs["stand_in"], Stores(workspace), progress=False)
        decide(runs["transformer"], Workspace(workspace))  # the process's next run: none of this is its
        next_runs = kernels.launched()
    finally:
        configs.use(previous)
    from launch_stand_in import LAUNCHED

    assert set(LAUNCHED) == {stored} and len(LAUNCHED) > 8  # each step's and validation's
    client = Stores(workspace).client()
    tags = client.get_run(stand_in.run_id).data.tags
    assert json.loads(tags[names.TRITON_LAUNCH]) == {key.name(): _label(stored)}
    assert stand_in.triton_launches == {key.name(): _label(stored)}  # in result.json too
    assert next_runs == {}  # what the next run's tag would name: nothing launched since its decision
