"""What one run trains on, decided once per process and handed down (`decide`): where and in what
precision (`Placement`: `train.accelerator` and `train.precision` resolved, `auto` on a CPU that claims
native bf16 by the run's whole step, ablate.train.choices.precision), on CUDA the attention backend and
compiling that `auto` measured fastest (ablate.train.choices.attention), `strategy: auto` over several
devices as ddp or fsdp by the memory plan (ablate.train.choices.strategy), and with them the run's
`model:` and `train:` sections as they train. The model's build, the LightningModule, the Trainer, the
run's tags and its final metrics all read this one `Decided`, so nothing downstream decides again, and
the tags name what trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ablate.core.workspace import Workspace
from ablate.hardware.precision import training_device
from ablate.model import kernels
from ablate.model.config import ModelConfig
from ablate.store import names
from ablate.train.choices.attention import Choice, choose_attention, training_config
from ablate.train.choices.precision import choose_step_precision
from ablate.train.choices.strategy import strategy_resolved
from ablate.train.config import TrainConfig


@dataclass(frozen=True)
class Placement:
    """Where a run trains: the device type (`train.accelerator` resolved; the Trainer's accelerator), the
    Lightning precision (`auto` resolved) and why."""

    device: str
    precision: str
    reason: str


def placement(cfg: TrainConfig, model: ModelConfig | None = None, *, device: str | None = None) -> Placement:
    """`train.accelerator` and `train.precision` resolved (ablate.hardware.precision); `auto` on a CPU that
    claims native bf16 by the whole training step of the run (`model`, `cfg`: ablate.train.choices.precision).
    `device`: a device type to place it on instead of `train.accelerator`'s (the sweep's time estimate,
    whose clock is the CPU's where the run's device has none). The one precision decision: a run's
    (`decide`) and the estimate's (ablate.sweep.estimate) are this function's."""
    device = device or training_device(cfg.accelerator)
    precision, why, _ = choose_step_precision(cfg.precision, device, model, cfg, key="train.precision")
    return Placement(device, precision, why)


@dataclass(frozen=True)
class Decided:
    """A run as it trains: its placement, the attention choice measured on CUDA (None: nothing measured),
    and its `model:` (with the chosen backend) and `train:` (compiling resolved) sections."""

    where: Placement
    choice: Choice | None
    model: ModelConfig
    train: TrainConfig

    def tags(self) -> dict[str, str]:
        """What was decided, as the run's tags: the precision and why, whether the model trains compiled
        (`train.compile` resolved: `auto` off CUDA trains eager), and on CUDA the measured choice's tags
        (ablate.train.choices.attention.Choice.tags; none where nothing was measured)."""
        return {
            names.PRECISION: self.where.precision,
            names.PRECISION_REASON: self.where.reason,
            names.COMPILED: str(self.train.compile is True).lower(),
            **(self.choice.tags() if self.choice else {}),
        }


def decide(run: Any, workspace: Workspace, *, where: Placement | None = None, **timing: Any) -> Decided:
    """`run` (a RunSpec) as it trains here: placed (or at `where`), then, on CUDA, its attention and
    compiling measured (`timing`: `choose_attention`'s `timer` and `device_key`, the tests' seam); what the
    model's kernels measure (the `triton` launch configurations) is kept in the workspace."""
    kernels.remember_in(workspace.kernel_configs)
    where = where or placement(run.train, run.model)
    choice = choose_attention(
        run.model, run.train, where.device, where.precision, workspace.attention_choices, **timing
    )
    model = choice.model(run.model) if choice else run.model
    kernels.record_launches()  # the run's launches from here: not the candidates measured above
    return Decided(where, choice, model, strategy_resolved(run.model, training_config(run.train, choice)))
