"""Cheap per-layer statistics, so a report can say why a row lags instead of giving a bare number.

At every validation, on one fixed held-out micro-batch (the first validation batch), forward hooks
measure these, logged to the run's MLflow metrics at the optimizer step:

- `rms/embed`: RMS of the token embeddings, the residual stream entering block 0;
- `rms/attn_out/layer_NN`: RMS of block NN's attention output (what it adds to the residual stream);
- `rms/residual/layer_NN`: RMS of the residual stream after block NN.

RMS = sqrt(mean of squares) over every element (batch, position, channel). Comparing `rms/attn_out`
with `rms/embed` shows, for example, per-head-normed attention (unit-scale head outputs) swamping
embeddings of std ~0.02 early in training. λ per layer is logged beside these by the training module
(`lambda/layer_NN`). The hooks exist only during that one forward: training and a compiled model never
see them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import lightning.pytorch as L
import torch
from torch import nn

from ablate.model.hooks import layer_outputs, outputs_into

EMBED = "rms/embed"


def attn_out_key(layer: int) -> str:
    return f"rms/attn_out/layer_{layer:02d}"


def residual_key(layer: int) -> str:
    return f"rms/residual/layer_{layer:02d}"


def _rms(t: torch.Tensor) -> float:
    return float(t.detach().double().square().mean().sqrt())


def _hooks(model: nn.Module, out: dict[str, float]) -> contextlib.AbstractContextManager:
    """While it is entered, each forward puts the statistics of the module doc into `out`."""
    outputs = layer_outputs(model)
    measured = {EMBED: outputs["embed"]}
    for layer in range(len(model.blocks)):
        measured[attn_out_key(layer)] = outputs[f"layer_{layer:02d}.attention"]
        measured[residual_key(layer)] = outputs[f"layer_{layer:02d}.residual"]
    return outputs_into(out, measured, _rms)


@torch.no_grad()
def layer_rms(model: nn.Module, tokens: torch.Tensor) -> dict[str, float]:
    """The statistics of the module doc for one forward of `model` (a `DecoderLM`) on `tokens` (batch, seq)."""
    out: dict[str, float] = {}
    with _hooks(model, out):
        model(tokens)
    return out


class LayerStats(L.Callback):
    """Logs `layer_rms` on the first validation micro-batch at every validation, through the module's
    `sink(metrics, step)` (global rank 0 only; other ranks have no sink and do nothing).

    An eager model is measured by hooks on validation's own forward of that batch (no extra work); a
    compiled one (`train.compile`) by one extra eager forward at the end of validation, so the compiled
    graph never sees a hook."""

    def __init__(self) -> None:
        self._tokens: torch.Tensor | None = None
        self._stats: dict[str, float] = {}
        self._hooks: contextlib.ExitStack | None = None

    @staticmethod
    def _eager(pl_module: L.LightningModule) -> bool:
        return getattr(pl_module, "compiled", pl_module.model) is pl_module.model

    def on_validation_batch_start(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        batch: torch.Tensor,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if batch_idx != 0 or trainer.sanity_checking or getattr(pl_module, "sink", None) is None:
            return
        self._stats = {}
        if self._eager(pl_module):
            self._hooks = contextlib.ExitStack()
            self._hooks.enter_context(_hooks(pl_module.model, self._stats))
        elif self._tokens is None:
            tokens = (
                batch["tokens"] if isinstance(batch, dict) else batch
            )  # a task's batch is a dict (task_data)
            self._tokens = tokens[:, :-1].detach().clone()  # the same held-out batch at every validation

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: object,
        batch: torch.Tensor,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._hooks is not None:
            self._hooks.close()
            self._hooks = None

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        sink: Callable[[dict[str, float], int], None] | None = getattr(pl_module, "sink", None)
        if trainer.sanity_checking or sink is None:
            return
        if not self._eager(pl_module) and self._tokens is not None:
            # Under the run's precision (autocast in bf16-mixed runs), as validation itself computes.
            with trainer.precision_plugin.val_step_context():
                self._stats = layer_rms(pl_module.model, self._tokens.to(pl_module.device))
        if self._stats:
            sink(dict(self._stats), trainer.global_step)
        self._stats = {}
