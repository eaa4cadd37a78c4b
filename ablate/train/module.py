"""The LightningModule of one run (`LMModule`: the loss, the logged metrics, validation). Its optimiser and
schedule are the run's (ablate.train.optimizer: AdamW, Appendix E, and the linear or wsd schedule). One
optimiser step sees `batch_tokens` tokens (gradient accumulation over micro-batches).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import lightning.pytorch as L
import torch
import torch.nn.functional as F

from ablate.core import contract
from ablate.model.decoder import DecoderLM
from ablate.train.config import TrainConfig
from ablate.train.metrics import SUM_KEYS, ar_hit_mask, sliced_loss_sums, task_summary, task_sums
from ablate.train.optimizer import for_run
from ablate.train.recompute import recompute_blocks
from ablate.train.resume import ACCUMULATE, rescale_batches
from ablate.train.sharding import gathered, grad_norm, shard, sharded


def compile_seconds() -> float:
    """Seconds this process has spent in torch.compile so far (forward and backward graphs, recompiles
    included), from dynamo's own accounting (a private API: 0 where a torch version lacks it); 0 before
    anything compiled."""
    try:
        from torch._dynamo.utils import calculate_time_spent
    except ImportError:
        return 0.0
    return float(calculate_time_spent().get("total_wall_time", 0.0))


class Diverged(RuntimeError):
    """The training loss became NaN or infinite."""


class LMModule(L.LightningModule):
    """Next-token cross-entropy on packed sequences; logs through `sink(metrics, step)`.

    With a `task` (ablate.data.tasks) the batches are dicts (ablate.data.task_batches): training takes the loss on
    the answer tokens (`loss_on='answers'`) or on every non-padding token ('all'); validation logs exact-match
    accuracy overall, per tag and per cell, and the loss on answers, which is also `val/loss` (the number
    checkpoints and sweeps select on).
    """

    def __init__(
        self,
        model: DecoderLM,
        cfg: TrainConfig,
        sink: Callable[[dict[str, float], int], None] | None,
        task: Any = None,
        loss_on: str = "answers",
        precision: str = "32-true",
    ):
        super().__init__()
        self.run_precision = precision  # resolved (ablate.train.choices.decided.Placement): fsdp's policy
        self.task, self.loss_on = task, loss_on
        if cfg.activation_checkpointing:
            recompute_blocks(model)  # before compiling: the compiled graph recomputes too
        self.model = model
        self.cfg = cfg
        self.sink = sink
        self.history: list[dict[str, float]] = []  # validation results, in order
        self._step_losses: list[torch.Tensor] = []
        self._grad_norm = float("nan")
        self._clock = (time.perf_counter(), 0)
        self._val: dict[str, torch.Tensor] = {}
        self.compiled = torch.compile(model) if cfg.compile is True else model  # `auto`: decided before
        self._compile_clock = (compile_seconds(), compile_seconds())  # (at start, at the last log)

    def configure_model(self) -> None:
        """Under `train.strategy: fsdp`, FSDP2 over every rank (ablate.train.sharding: Lightning's
        ModelParallelStrategy calls this once its device mesh is set up); otherwise nothing."""
        if sharded(self.cfg):
            shard(self.model, self.device_mesh["data_parallel"], self.run_precision)

    # --- training -------------------------------------------------------------------------------
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.compiled(tokens)

    def training_step(self, batch: torch.Tensor | dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if isinstance(batch, dict):  # a task: the loss on the answers (or on all tokens), never on padding
            logits = self(batch["tokens"][:, :-1])
            per_token = F.cross_entropy(
                logits.float().flatten(0, 1), batch["tokens"][:, 1:].flatten(), reduction="none"
            )
            mask = batch["answer_mask" if self.loss_on == "answers" else "loss_mask"].flatten().float()
            loss = (per_token * mask).sum() / mask.sum().clamp(min=1)
        else:
            logits = self(batch[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        # On several ranks only the gradient check below raises: it sees all-reduced gradients, so every
        # rank stops at the same step instead of one waiting for the others in a collective.
        if self.trainer.world_size == 1 and not torch.isfinite(loss):
            raise Diverged(f"training loss is {loss.item()} at step {self.global_step + 1}")
        self._step_losses.append(loss.detach())
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        self._grad_norm = grad_norm(grads, self.trainer.strategy.reduce)
        if not math.isfinite(self._grad_norm):
            raise Diverged(f"gradient norm is {self._grad_norm} at step {self.global_step + 1}")

    def on_train_batch_end(self, outputs: Any, batch: torch.Tensor, batch_idx: int) -> None:
        if (batch_idx + 1) % self.trainer.accumulate_grad_batches:
            return  # mid-accumulation: no optimizer step yet
        step = self.global_step
        losses, self._step_losses = self._step_losses, []
        if step % self.cfg.log_every and step not in (1, self.cfg.steps):
            return  # step 1 is always logged: its loss is the initial loss (no update has happened yet)
        loss = torch.stack(losses).mean() if losses else torch.tensor(float("nan"), device=self.device)
        loss = float(
            self.trainer.strategy.reduce(loss, reduce_op="mean")
        )  # all ranks: the global batch's loss
        if self.sink is None:
            return  # not global rank 0
        now, last_step = time.perf_counter(), self._clock[1]
        compiled = compile_seconds()  # compile time is reported apart, not counted as training time
        seconds = now - self._clock[0] - (compiled - self._compile_clock[1])
        self._clock, self._compile_clock = (now, step), (self._compile_clock[0], compiled)
        metrics = {
            "train/loss": loss,
            "lr": self.trainer.optimizers[0].param_groups[0]["lr"],
            "grad_norm": self._grad_norm,
            "tokens": step * self.cfg.batch_tokens,
            "tokens_per_s": (step - last_step) * self.cfg.batch_tokens / seconds
            if seconds > 0
            else float("nan"),
        }
        if self.cfg.compile is True:
            metrics["compile_s"] = compiled - self._compile_clock[0]
        self.sink(metrics, step)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[ACCUMULATE] = self.cfg.accumulate  # a resume on another number of ranks rescales by it

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        rescale_batches(checkpoint, self.cfg.accumulate)

    def configure_optimizers(self):
        optimizer, schedule = for_run(self.model, self.cfg)  # ablate.train.optimizer: the one AdamW
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    # --- validation -----------------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        self._val = {key: torch.zeros((), dtype=torch.float64, device=self.device) for key in SUM_KEYS}
        if self.task is not None:
            self._val = {
                "task": torch.zeros((len(self.task.cells()), 4), dtype=torch.float64, device=self.device)
            }

    def validation_step(self, batch: torch.Tensor | dict[str, torch.Tensor], batch_idx: int) -> None:
        if isinstance(batch, dict):
            logits = self(batch["tokens"][:, :-1]).float()
            per_token = F.cross_entropy(
                logits.flatten(0, 1), batch["tokens"][:, 1:].flatten(), reduction="none"
            )
            self._val["task"] += task_sums(
                per_token.view(logits.shape[:2]), logits.argmax(-1), batch, len(self.task.cells())
            )
            return
        logits = self(batch[:, :-1])
        per_token = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction="none")
        sums = sliced_loss_sums(per_token.view(batch.shape[0], -1), ar_hit_mask(batch))
        for key, value in sums.items():
            self._val[key] = self._val[key] + value

    def _lm_val_metrics(self) -> dict[str, float]:
        # Each rank validated its share of the held-out batches: sum the sums over ranks (one collective).
        summed = self.trainer.strategy.reduce(torch.stack([self._val[k] for k in SUM_KEYS]), reduce_op="sum")
        v = dict(zip(SUM_KEYS, summed.tolist()))
        total = v["total_count"]
        return {
            "val/loss": v["total_sum"] / total,
            "val/ar_hit": v["ar_hit_sum"] / v["ar_hit_count"] if v["ar_hit_count"] else float("nan"),
            "val/others": v["others_sum"] / v["others_count"] if v["others_count"] else float("nan"),
            "val/ar_hit_share": v["ar_hit_count"] / total,
            "tokens": self.global_step * self.cfg.batch_tokens,
        }

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking or not self._val:
            return
        if self.task is not None:
            summed = self.trainer.strategy.reduce(self._val["task"], reduce_op="sum")
            metrics = task_summary(summed, self.task.cells())
            metrics.update(
                {"val/loss": metrics["val/answer_loss"], "tokens": self.global_step * self.cfg.batch_tokens}
            )
        else:
            metrics = self._lm_val_metrics()
        for i, block in enumerate(self.model.blocks):
            with gathered(block):  # under fsdp λ's vectors are sharded
                lam = contract.lambda_value(block.attention)  # ablate.core.contract
            if lam is not None:
                metrics[f"lambda/layer_{i:02d}"] = lam
        if not math.isfinite(metrics["val/loss"]):
            raise Diverged(f"validation loss is {metrics['val/loss']} at step {self.global_step}")
        self.log("val/loss", metrics["val/loss"], logger=False)  # for checkpoint selection
        self.history.append({"step": self.global_step, **metrics})
        if self.sink is not None:
            self.sink(metrics, self.global_step)
