"""Tasks end to end: a plugin task (one file, one decorator, `imports:`) trained from a recipe with a real
Lightning Trainer and MLflow store; a multi-needle sweep through the CLI writes the task report."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch
import yaml
from torch import nn

from ablate.cli import main
from ablate.core.contract import AttentionMaps
from ablate.core.registry import register
from ablate.recipe.loading import load_recipe
from ablate.store.stores import Stores
from ablate.train.run import train_run

PLUGIN = '''
"""A user's task: copy the first token to the end."""
import numpy as np

from ablate.data.tasks import Sample, Task
from ablate.core.registry import register


@register("task", "test_copy_first")
class CopyFirst(Task):
    """Copy the first token at the end (test plugin task)."""

    def __init__(self, *, length: int = 12, vocab: int = 16):
        self.length, self.vocab_size, self.max_length = length, vocab, length

    def cells(self):
        return [{"length": self.length}]

    def generate(self, rng, cell):
        tokens = rng.integers(1, self.vocab_size, size=self.length)
        tokens[-1] = tokens[0]
        return Sample(tokens=tokens, answer_positions=np.array([self.length - 1]),
                      answer_spans=np.array([[0, 1]]), context=(0, self.length - 1), tags=dict(cell))
'''

MODEL = {
    "vocab_size": 64,
    "d_model": 32,
    "n_layers": 2,
    "head_dim": 8,
    "attention": {"name": "softmax"},
    "attention_backend": "sdpa",
}
TRAIN = {
    "seq_len": 16,
    "batch_tokens": 256,
    "micro_batch_size": 16,
    "steps": 60,
    "lr": 1.0e-2,
    "warmup_steps": 5,
    "val_every": 30,
    "val_batches": 2,
    "log_every": 10,
    "precision": "32-true",
}
NEEDLE_MODEL = {**MODEL, "vocab_size": 128}  # the multi-needle task's tokens


def _needle_train(*, steps: int) -> dict:
    """TRAIN at the multi-needle task's 96-token windows, 4 a micro-batch, validated once at the end."""
    return {
        **TRAIN,
        "seq_len": 96,
        "batch_tokens": 384,
        "micro_batch_size": 4,
        "steps": steps,
        "val_every": steps,
    }


@register("attention", "test_e2e_uniform")
class UniformAttention(nn.Module):
    """Causal average of the values (test attention that keeps the analysis contract)."""

    residual_out = ("out_proj.weight",)

    def __init__(self, *, d_model: int):
        super().__init__()
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x):
        return self.attend_with_maps(x)[0]

    def attend_with_maps(self, x, *, logit_transform=None):
        n = x.shape[1]
        e = (torch.tril(torch.ones(n, n)) / torch.arange(1, n + 1)[:, None])[None, None].expand(
            x.shape[0], 1, n, n
        )
        return self.out_proj(e[:, 0] @ self.v_proj(x)), AttentionMaps(logits=(), effective=e)


def _write(tmp_path: Path, recipe: dict) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _needles_recipe(tmp_path: Path, *, steps: int, depths: list[int], **top) -> Path:
    """`needles`: the Transformer against the uniform test attention on multi_needle at levels N1R1 and
    N2R2, the `depths` given, `steps` steps; `top`: more top-level keys (seeds)."""
    task = {
        "name": "multi_needle",
        "levels": [[1, 1], [2, 2]],
        "depths": depths,
        "lengths": [64, 97],
        "n_filler_tokens": 32,
        "n_key_tokens": 16,
    }
    return _write(
        tmp_path,
        {
            "name": "needles",
            **top,
            "base": {"model": NEEDLE_MODEL, "train": _needle_train(steps=steps), "data": {"task": task}},
            "variants": {
                "transformer": {"label": "Transformer"},
                "uniform": {"label": "Uniform", "model": {"attention": {"name": "test_e2e_uniform"}}},
            },
        },
    )


def _client(workspace: Path):
    return Stores(workspace).client()


class Batches(L.Callback):
    def __init__(self):
        self.batches = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.batches.append(batch["tokens"].clone())


def test_plugin_task_trains_from_a_recipe(tmp_path, monkeypatch):
    (tmp_path / "copy_task_plugin.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    recipe = _write(
        tmp_path,
        {
            "name": "copytask",
            "imports": ["copy_task_plugin"],
            "base": {
                "model": MODEL,
                "train": TRAIN,
                "data": {"task": {"name": "test_copy_first", "length": 12}},
            },
            "variants": {"transformer": {"label": "Transformer"}},
        },
    )
    (run,) = load_recipe(recipe).resolve()
    assert run.config["data"]["task"] == {"name": "test_copy_first", "length": 12}
    workspace = tmp_path / "ws"
    result = train_run(run, Stores(workspace), progress=False)
    client = _client(workspace)
    metrics = client.get_run(result.run_id).data.metrics
    for key in ("val/accuracy", "val/answer_loss", "val/loss", "val/accuracy/length_12", "train/loss"):
        assert key in metrics, key
    assert metrics["val/loss"] == metrics["val/answer_loss"] == pytest.approx(result.val_loss)
    history = {m.step: m.value for m in client.get_metric_history(result.run_id, "val/answer_loss")}
    assert history[60] < history[30]  # it learns from the answer tokens
    assert result.accuracy > 1 / 15  # above chance (15 possible first tokens)
    assert "accuracy" in result.summary()


def test_every_variant_sees_the_same_samples_and_attention_is_logged(tmp_path):
    recipe = _needles_recipe(tmp_path, steps=3, depths=[0, 100])
    seen = {}
    for run in load_recipe(recipe).resolve(seeds=[0]) + load_recipe(recipe).resolve(
        seeds=[1], variants=["uniform"]
    ):
        batches = Batches()
        result = train_run(run, Stores(tmp_path / "ws"), progress=False, callbacks=[batches])
        seen[run.name] = torch.stack(batches.batches)
        metrics = _client(tmp_path / "ws").get_run(result.run_id).data.metrics
        assert "val/accuracy_cell/level_N2R2/depth_100/length_97" in metrics
        if run.variant == "uniform":  # keeps the contract: Table 3's shares are logged per depth
            assert 0 < metrics["attn/answer_share/depth_0"] < metrics["attn/noise_share/depth_0"] < 1
    assert torch.equal(seen["transformer-s0"], seen["uniform-s0"])
    assert not torch.equal(seen["uniform-s0"], seen["uniform-s1"])


@pytest.mark.slow
def test_task_sweep_writes_the_task_report(tmp_path, capsys):
    recipe = _needles_recipe(tmp_path, steps=4, depths=[0, 50, 100], seeds=[0, 1])
    assert (
        main(
            [
                "sweep",
                str(recipe),
                "--yes",
                "--allow-unmatched",
                "--workspace",
                str(tmp_path / "ws"),
                "--reports",
                str(tmp_path / "rep"),
            ]
        )
        == 0
    )
    report = tmp_path / "rep" / "needles"
    table = (report / "table.md").read_text()
    header = next(line for line in table.splitlines() if line.startswith("| Model"))
    assert "| Valid " in header and "AR-Hit" not in header and "paper" not in header  # none of a task's
    assert "n/a" not in table
    accuracy = (report / "task_accuracy.md").read_text()
    assert "level N1R1" in accuracy and "level N2R2" in accuracy and "(reference)" in accuracy
    assert "Uniform" in accuracy and "[" in accuracy  # two seeds: intervals
    attention = (report / "task_attention.md").read_text()
    for label in ("Transformer", "Uniform"):  # softmax attention exposes its maps too (attend_with_maps)
        assert re.search(rf"\| {label} +\| answer \|", attention) and re.search(
            rf"\| {label} +\| noise  \|", attention
        )
    assert "50%" in attention
    for variant in ("transformer", "uniform"):
        assert (report / f"heatmap_{variant}.png").read_bytes()[:4] == b"\x89PNG"
    client = _client(tmp_path / "ws")
    exp = client.get_experiment_by_name("needles")
    (parent,) = [
        r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("ablate.role") == "sweep"
    ]
    attached = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/task_accuracy.md", "report/task_attention.md", "report/heatmap_uniform.png"} <= attached


@pytest.mark.parametrize("task_loss", ["answers", "all"])
def test_training_loss_is_on_the_answers_or_on_every_real_token(tmp_path, task_loss):
    import torch.nn.functional as F

    from ablate.data.task_batches import TaskTrainBatches, build_task
    from ablate.model.decoder import build_model

    recipe = _write(
        tmp_path,
        {
            "name": "loss",
            "base": {
                "model": NEEDLE_MODEL,
                "train": _needle_train(steps=1),
                "data": {
                    "task": {
                        "name": "multi_needle",
                        "levels": [[2, 2]],
                        "lengths": [64, 97],
                        "n_filler_tokens": 32,
                        "n_key_tokens": 16,
                    },
                    "task_loss": task_loss,
                },
            },
            "variants": {"transformer": {"label": "Transformer"}},
        },
    )
    (run,) = load_recipe(recipe).resolve()
    result = train_run(run, Stores(tmp_path / "ws"), progress=False)
    logged = {
        m.step: m.value for m in _client(tmp_path / "ws").get_metric_history(result.run_id, "train/loss")
    }
    # Step 1's loss is the first micro-batch's under the initial weights: recompute it here, in float64.
    model = build_model(run.config["model"], seed=0).double()
    batch = TaskTrainBatches(build_task(run.config["data"]), seq_len=96, micro_batch_size=4, seed=0).batch(0)
    tokens = batch["tokens"]
    with torch.no_grad():
        per_token = F.cross_entropy(
            model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten(), reduction="none"
        )
    mask = (tokens[:, 1:] != 0) if task_loss == "all" else batch["answer_mask"]
    if task_loss == "answers":
        # independent of the batch's mask: the value tokens after each query's IS marker
        from ablate.data.tasks.multi_needle import QUERY

        answer = torch.zeros_like(mask)
        for row in range(tokens.shape[0]):
            for q in torch.nonzero(tokens[row] == QUERY).flatten().tolist():
                answer[row, q + 3 : q + 6] = (
                    True  # QUERY k k IS v v v: targets of the values (key 2, value 3)
                )
        assert torch.equal(answer, mask)
    expected = float(per_token[mask.flatten().bool()].mean())
    assert logged[1] == pytest.approx(expected, rel=1e-4)
