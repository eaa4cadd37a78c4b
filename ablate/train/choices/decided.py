"""What one run trains on, decided once per process and handed down (`decide`): where and in what
precision (`Placement`: `train.accelerator` and `train.precision` resolved, `auto` on a CPU that claims
native bf16 by the run's whole step, ablate.train.choices.precision), on CUDA the attention backend and
compiling that `auto` measured fastest (ablate.train.choices.attention), and with them the run's `model:`
and `train:` sections as they train. The model's build, the LightningModule, the Trainer, the run's tags
and its final metrics all read this one `Decided`, so nothing downstream decides again, and the tags name
what trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ablate.core.workspace import Workspace
from ablate.hardware.precision import training_device
from ablate.model import kernels
from ablate.model.config import ModelConfig
from ablate.train.choices.attention import Choice, choose_attention, training_config
from ablate.train.choices.precision import choose_step_precision
from ablate.train.config import TrainConfig


@dataclass(frozen=True)
class Placement:
    """Where a run trains: the device type (`train.accelerator` resolved; the Trainer's accelerator), the
    Lightning precision (`auto` resolved) and why."""

    device: str
    precision: str
    reason: str


def placement(cfg: TrainConfig, model: ModelConfig | None = None) -> Placement:
    """`train.accelerator` and `train.precision` resolved (ablate.hardware.precision); `auto` on a CPU that
    claims native bf16 by the whole training step of the run (`model`, `cfg`: ablate.train.choices.precision)."""
    device = training_device(cfg.accelerator)
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
        """The measured choice's tags (ablate.train.choices.attention.Choice.tags); none where none was."""
        return self.choice.tags() if self.choice else {}


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
    return Decided(where, choice, model, training_config(run.train, choice))
