"""The run's training step, built and timed in one place: what `auto` measures to decide (the precision on
a CPU, ablate.train.choices.precision; the attention backend and compiling on CUDA,
ablate.train.choices.attention) and what `ablate bench` times is the step the run takes.

`build_step` makes it from the run's own sections: the model (`model:`, with the candidate's backend), its
optimizer and lr schedule (ablate.train.optimizer, the one that trains: parameter groups, lr, betas, eps,
weight decay), compiled where `train.compile` is true (as `LMModule` compiles), one micro-batch of the
run's shape (`train.seq_len` x `train.micro_batch_size`, or `batch` sequences), in the run's resolved
precision. `train_step` is one step as Lightning takes it with one micro-batch per optimizer step: forward
under the precision's autocast, the float32 loss, backward, gradient-norm clipping by `train.grad_clip`
over the optimizer's parameters, the optimizer step, its zeroed gradients and the schedule's step.
`16-mixed`'s loss scaling is left out (its scaler's few element-wise passes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ablate.hardware.device import DeviceOps
from ablate.hardware.precision import autocast
from ablate.model.config import ModelConfig
from ablate.model.decoder import build_model
from ablate.train.config import TrainConfig
from ablate.train.optimizer import for_run


@dataclass
class TimedStep:
    """One training step ready to run: the model as it runs (compiled where the run compiles), the run's
    optimizer and schedule, a micro-batch of tokens ((batch, seq_len + 1)), where and in what precision."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler
    tokens: torch.Tensor
    precision: str  # a resolved Lightning precision (ablate.hardware.precision)
    ops: DeviceOps  # the device's clock and memory peak
    grad_clip: float = 0.0

    @property
    def n_tokens(self) -> int:
        return self.tokens.shape[0] * (self.tokens.shape[1] - 1)


def build_step(
    model: ModelConfig,
    train: TrainConfig,
    precision: str,
    ops: DeviceOps,
    *,
    batch: int | None = None,
    seed: int = 0,
) -> TimedStep:
    """The run's step (module docstring) on `ops.device`: `batch` sequences (default the run's
    micro-batch) of random tokens, the model initialised from `seed`."""
    net = build_model(model, seed=seed).to(ops.device)
    optimizer, schedule = for_run(net, train)
    runnable = torch.compile(net) if train.compile is True else net
    generator = torch.Generator().manual_seed(seed)
    shape = (batch or train.micro_batch_size, train.seq_len + 1)
    tokens = torch.randint(0, model.vocab_size, shape, generator=generator).to(ops.device)
    return TimedStep(runnable, optimizer, schedule, tokens, precision, ops, train.grad_clip)


def train_step(step: TimedStep) -> tuple[float, float]:
    """One training step (module docstring); returns (seconds of the whole step, seconds of its optimizer
    part: clipping, the AdamW step, zeroing and the schedule)."""
    start = step.ops.now()
    with autocast(step.ops.device, step.precision):
        logits = step.model(step.tokens[:, :-1])
    loss = F.cross_entropy(logits.float().flatten(0, 1), step.tokens[:, 1:].flatten())
    loss.backward()
    middle = step.ops.now()
    if step.grad_clip:  # as Lightning clips: the 2-norm over the optimizer's parameters, group by group
        params = [p for group in step.optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, step.grad_clip)
    step.optimizer.step()
    step.optimizer.zero_grad(set_to_none=True)
    step.schedule.step()
    end = step.ops.now()
    return end - start, end - middle


def forward_step(step: TimedStep) -> None:
    """The forward alone, without gradients, in the step's precision."""
    with torch.no_grad(), autocast(step.ops.device, step.precision):
        step.model(step.tokens[:, :-1])
