"""The optimizer and its schedule, built here and nowhere else: training (`LMModule.configure_optimizers`),
the coordinate check (ablate.train.coord) and every timed step (ablate.train.choices.timed_step, which `auto`'s
choices and `ablate bench` time) call this module, so what is timed and checked is what trains.

Optimizer (Appendix E): AdamW with the recipe's betas, eps and weight decay. Weight decay applies to the
matrices (embedding, projections, LM head: every parameter with 2 or more dimensions); it does not apply
to vectors: norm weights and diff attention's λ vectors (decaying λ would pull it towards λ_init's
re-parameterised zero point, which the paper does not ask for). Under `model.parametrization: mup` each
parameter's lr, decay and eps follow its μP rule instead (ablate.model.parametrization.param_groups).

Schedule (`train.schedule`): linear warmup from 0 over `warmup_steps`, then either linear decay to `min_lr`
at `steps` (`linear`, Appendix E) or warmup-stable-decay (`wsd`, Hägele et al. 2024, arXiv 2405.18392):
constant until `cooldown_start`, then down to `min_lr` over the last `cooldown_fraction` of the steps,
linearly or as 1 - sqrt(t). Before its cooldown a wsd run's lr does not depend on `steps`, which is what
lets one long run branch into every shorter budget (ablate.train.branches).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from ablate.model.parametrization import param_groups
from ablate.train.config import TrainConfig


def adamw(
    model: nn.Module, *, lr: float, weight_decay: float, betas: Sequence[float], eps: float
) -> torch.optim.AdamW:
    """AdamW over `model`'s parameter groups (module docstring): decay on matrices only, or μP's groups."""
    groups = param_groups(model, lr=lr, weight_decay=weight_decay, eps=eps)
    return torch.optim.AdamW(groups, lr=lr, betas=(float(betas[0]), float(betas[1])), eps=eps)


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of `lr` for optimizer step `step` (0-based): linear warmup, then the decay of
    `cfg.schedule` (module docstring)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    floor = cfg.min_lr / cfg.lr
    if cfg.schedule == "wsd":
        if step < cfg.cooldown_start:
            return 1.0
        t = min(1.0, (step - cfg.cooldown_start) / cfg.cooldown_steps)  # 0 at the cooldown's first step
        return floor + (1.0 - floor) * (1.0 - (math.sqrt(t) if cfg.cooldown_shape == "sqrt" else t))
    remaining = max(0.0, (cfg.steps - step) / max(1, cfg.steps - cfg.warmup_steps))
    return floor + (1.0 - floor) * remaining


def for_run(
    model: nn.Module, cfg: TrainConfig
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """The run's AdamW (its `train:` lr, betas, eps, weight decay) and its lr schedule, stepped once per
    optimizer step."""
    optimizer = adamw(model, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.betas, eps=cfg.eps)
    # A plain function, not a callable object: LambdaLR then keeps it out of the checkpoint, which
    # stays loadable with weights_only=True; the schedule is rebuilt from the recipe on resume.
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))
    return optimizer, schedule
