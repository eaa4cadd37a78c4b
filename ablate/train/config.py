"""The recipe's `train:` section (`TrainConfig`): the training options, checked when a recipe resolves.

Every layer may import this module (the recipe resolves it, reports read its schedule): it imports only
`ablate.core` (tests/ablate/test_layers.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ablate.core.config import Precision, check_sizes, size
from ablate.core.errors import UserError

# Lightning strategies that start processes by spawning/forking the caller: ablate launches ranks itself.
SPAWNING_STRATEGIES = ("ddp_spawn", "ddp_fork", "ddp_notebook", "ddp_spawn_find_unused_parameters_true")

# The size knobs' limits (ablate.core.config.size): a context of 1M tokens, 128M tokens a step (Llama 3
# took 16M), a billion steps, a thousand devices a node and 64K nodes are all allowed; a typo is not.
MAX_SEQ_LEN = 1 << 20
MAX_BATCH_TOKENS = 1 << 27
MAX_MICRO_BATCH = 1 << 16
MAX_STEPS = 10**9
MAX_VAL_BATCHES = 1 << 16
MAX_DEVICES = 1 << 10
MAX_NODES = 1 << 16


def cooldown_steps_of(steps: int, cooldown_fraction: float) -> int:
    """wsd: optimizer steps of the cooldown of a `steps`-step run: its last `cooldown_fraction`, rounded."""
    return round(cooldown_fraction * steps)


@dataclass(frozen=True)
class TrainConfig:
    """The recipe's `train:` section. Defaults are the paper's Appendix E where it states them.

    Attributes:
        seq_len: tokens per training sequence
        batch_tokens: tokens per optimizer step (all devices, all accumulation steps)
        micro_batch_size: sequences per forward pass on one device
        steps: optimizer steps
        lr: peak learning rate (AdamW)
        betas: AdamW betas (Appendix E: 0.9, 0.98)
        eps: AdamW epsilon (not stated in the paper: PyTorch's default)
        weight_decay: AdamW weight decay (Appendix E)
        warmup_steps: linear warmup steps (Appendix E)
        min_lr: the decay (linear, or wsd's cooldown) ends at this learning rate
        schedule: linear (warmup, then linear decay to min_lr: the paper's) or wsd (warmup, constant,
            cooldown over the last cooldown_fraction of the steps: Hägele et al. 2024, arXiv 2405.18392)
        cooldown_fraction: wsd: the share of the steps that cools down
        cooldown_shape: wsd: linear, or sqrt (lr falls as 1 - sqrt(t), Hägele et al.)
        grad_clip: gradient-norm clipping (not stated in the paper: the common choice)
        precision: Lightning precision
        val_every: optimizer steps between validations (and checkpoints)
        val_batches: micro-batches in the fixed held-out set
        log_every: optimizer steps between logged training metrics
        compile: run the model under torch.compile: true, false, or auto (on CUDA, compiled where one timed
            step says it is faster, ablate.train.choices.attention; elsewhere eager: on a CPU a cold
            compile costs more than a short run saves, benchmarks/NOTES.md)
        deterministic: ask PyTorch for deterministic kernels
        accelerator: Lightning accelerator (auto, cpu, gpu, ...)
        devices: devices per node (several: DDP, started by ablate itself)
        num_nodes: nodes (several: run the same command on each, see docs/scaling-out.md)
        strategy: auto (one device; several: ddp, or fsdp where the memory plan says a replica does not
            fit), ddp (a whole replica on every device), or fsdp (FSDP2 through Lightning's
            ModelParallelStrategy: parameters, gradients and AdamW's state sharded over the devices;
            docs/scaling-out.md)
        activation_checkpointing: recompute each decoder block's activations in the backward instead of
            keeping them (the same losses, less memory, about one more forward's time)
        gpu_memory_gb: the memory of one device the plan is checked against where no GPU is present (None:
            this machine's GPU, or an 80 GB card)
    """

    seq_len: int = size(MAX_SEQ_LEN)
    batch_tokens: int = size(MAX_BATCH_TOKENS)
    micro_batch_size: int = size(MAX_MICRO_BATCH)
    steps: int = size(MAX_STEPS)
    lr: float
    betas: tuple[float, float] = (0.9, 0.98)  # Appendix E
    eps: float = 1e-8
    weight_decay: float = 0.05  # Appendix E
    warmup_steps: int = 375  # Appendix E
    min_lr: float = 0.0  # linear decay to this (Appendix E: "linear rate decay")
    schedule: Literal["linear", "wsd"] = "linear"  # Appendix E: linear; wsd makes every budget a branch
    cooldown_fraction: float = 0.2  # Hägele et al. 2024: 20% of the run is enough to match a cosine
    cooldown_shape: Literal["linear", "sqrt"] = "linear"
    grad_clip: float = 1.0  # not stated in the paper: the common choice
    precision: Precision = (
        "auto"  # bf16-mixed where the device runs bf16 natively, else 32-true (ablate.hardware.precision)
    )
    val_every: int = size(MAX_STEPS, default=1000)  # optimizer steps between validations (and checkpoints)
    val_batches: int = size(MAX_VAL_BATCHES, default=16)  # micro-batches in the fixed held-out set
    log_every: int = size(MAX_STEPS, default=10)
    compile: bool | Literal["auto"] = "auto"
    deterministic: bool = False
    accelerator: str = "auto"
    devices: int = size(MAX_DEVICES, default=1)
    num_nodes: int = size(MAX_NODES, default=1)
    strategy: str = "auto"
    activation_checkpointing: bool = False
    gpu_memory_gb: float | None = None

    def __post_init__(self) -> None:
        check_sizes(self, "train")
        if not 0 < self.lr < math.inf:
            raise UserError(f"train.lr: must be a positive number, got {self.lr}")
        for name in (
            "eps",
            "weight_decay",
            "min_lr",
            "grad_clip",
            "warmup_steps",
        ):  # what AdamW/LambdaLR accept
            if not 0 <= getattr(self, name) < math.inf:
                raise UserError(f"train.{name}: must be a non-negative number, got {getattr(self, name)}")
        if not 0 < self.cooldown_fraction <= 1:
            raise UserError(f"train.cooldown_fraction: must be in (0, 1], got {self.cooldown_fraction}")
        if self.schedule == "wsd" and self.cooldown_steps < 1:
            raise UserError(
                f"train.cooldown_fraction: {self.cooldown_fraction} of {self.steps} steps rounds to no "
                "cooldown step; raise it or train more steps"
            )
        if not all(0 <= beta < 1 for beta in self.betas):
            raise UserError(f"train.betas: each must be in [0, 1), got {list(self.betas)}")
        if self.strategy in SPAWNING_STRATEGIES:
            raise UserError(
                f"train.strategy: {self.strategy!r} is not supported; use ddp (ablate starts one "
                "process per device itself, see ablate/train/launch.py)"
            )
        if self.gpu_memory_gb is not None and not 0 < self.gpu_memory_gb < math.inf:
            raise UserError(f"train.gpu_memory_gb: must be a positive number of GB, got {self.gpu_memory_gb}")
        world = self.devices * self.num_nodes
        if world > 1 and self.val_batches < world:
            raise UserError(
                f"train.val_batches: {self.val_batches} is fewer than devices x num_nodes = {world}; "
                "every rank validates a share of the held-out batches"
            )
        per_pass = self.seq_len * self.micro_batch_size * self.devices * self.num_nodes
        if self.batch_tokens % per_pass:
            raise UserError(
                f"train.batch_tokens: {self.batch_tokens} is not a multiple of seq_len x micro_batch_size x "
                f"devices x num_nodes = {per_pass}"
            )

    @property
    def accumulate(self) -> int:
        """Micro-batches per optimizer step on each device."""
        return self.batch_tokens // (self.seq_len * self.micro_batch_size * self.devices * self.num_nodes)

    @property
    def tokens(self) -> int:
        return self.steps * self.batch_tokens

    @property
    def cooldown_steps(self) -> int:
        """wsd: optimizer steps of the cooldown (`cooldown_steps_of`)."""
        return cooldown_steps_of(self.steps, self.cooldown_fraction)

    @property
    def cooldown_start(self) -> int:
        """wsd: the first step of the cooldown; before it the lr does not depend on `steps`, so a longer
        run's state at this step is this run's state at this step (the branch point of a budget)."""
        return self.steps - self.cooldown_steps


# Train keys added after runs were first keyed, with their defaults: a run at the defaults hashes as before
# (ablate.recipe.resolve.RunSpec.key), so studies made before the key existed keep their run keys.
TRAIN_KEYS_ADDED_LATER = {
    "schedule": "linear",
    "cooldown_fraction": 0.2,
    "cooldown_shape": "linear",
    "activation_checkpointing": False,
    "gpu_memory_gb": None,
}

# A value that took an earlier default's place is keyed as that default: `compile: auto` (the default since
# it replaced `false`) keys as `false`, so runs made before keep their keys. It names how the run is
# computed, not which run it is, as `attention_backend: auto` does.
TRAIN_VALUES_KEYED_AS = {"compile": {"auto": False}}
