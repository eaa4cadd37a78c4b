"""Token budgets: a recipe's (or scale's) `budgets:`, the lengths every row is trained to from one run.

    budgets: {tokens: [524288, 1048576, 2097152, 4194304]}    # or {steps: [125, 250, 500, 1000]}

With `train.schedule: wsd` a run's learning rate before its cooldown does not depend on the run's length
(Hägele et al. 2024, arXiv 2405.18392), so the run of a smaller budget is the longest run up to that
budget's cooldown start, then its own cooldown. The sweep trains each (variant, size, seed) once to the
largest budget, which sets `train.steps`, and branches the others off it (ablate.train.branches).
"""

from __future__ import annotations

from dataclasses import dataclass

from jsonargparse.typing import PositiveInt

from ablate.core.errors import UserError
from ablate.train.config import TrainConfig


@dataclass(frozen=True)
class Budgets:
    """Training budgets every row is trained to (one of the two keys).

    Attributes:
        tokens: budgets in training tokens (each a multiple of train.batch_tokens)
        steps: budgets in optimizer steps
    """

    tokens: list[PositiveInt] | None = None
    steps: list[PositiveInt] | None = None


def budget_steps(budgets: Budgets, train: TrainConfig, key: str = "budgets") -> tuple[int, ...]:
    """The budgets in optimizer steps, ascending, checked against `train`; the last is the longest run's."""
    if (budgets.tokens is None) == (budgets.steps is None):
        raise UserError(f"{key}: give exactly one of tokens: [...] or steps: [...]")
    if budgets.tokens is not None:
        for tokens in budgets.tokens:
            if tokens % train.batch_tokens:
                raise UserError(
                    f"{key}.tokens: {tokens} is not a multiple of train.batch_tokens ({train.batch_tokens}); "
                    f"a budget is a whole number of optimizer steps"
                )
        steps = sorted({tokens // train.batch_tokens for tokens in budgets.tokens})
    else:
        steps = sorted(set(budgets.steps or ()))
    if len(steps) < 2:
        raise UserError(f"{key}: {steps} is one budget; give two or more (one is just train.steps)")
    if train.schedule != "wsd":
        raise UserError(
            f"{key}: need train.schedule: wsd, got {train.schedule!r}; under a linear decay a checkpoint "
            "inside a run is not a run at a smaller budget"
        )
    for n in steps:
        start = n - round(train.cooldown_fraction * n)
        if start < train.warmup_steps or start == n:
            raise UserError(
                f"{key}: the budget of {n} steps would cool down from step {start}, "
                + (
                    f"inside the warmup (train.warmup_steps {train.warmup_steps})"
                    if start < train.warmup_steps
                    else "with no cooldown step"
                )
                + "; use larger budgets"
            )
    return tuple(steps)
