"""`train.strategy: auto` decided by the memory plan (ablate.model.memory), and a plan that fits no device
refused before anything trains.

`auto` on one device trains there (Lightning's own `auto`); on several it is `ddp` where a replica fits
one device and `fsdp` (FSDP2 over every rank) where it does not. The device is this machine's GPU, else
`train.gpu_memory_gb`, else an 80 GB card (an H100 or A100), and each run is planned in the precision it
takes on that card (`choose_precision`, where every run's precision is decided). `decide`
(ablate.train.choices.decided) hands the chosen strategy down; `ablate check`, a sweep's plan and
`ablate train` print or refuse with the same `choose_strategy`, so the strategy a plan names is the one
that trains.

A refusal says what would fit, each found by planning it: FSDP2 on the fewest devices that hold the run
(a world that divides the batch), the largest smaller micro-batch, and activation checkpointing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ablate.core.errors import UserError
from ablate.hardware.device import gpu_memory_bytes
from ablate.hardware.precision import choose_precision
from ablate.model.config import ModelConfig
from ablate.model.memory import GB, MemoryPlan, memory_plan
from ablate.train.config import MAX_DEVICES, TrainConfig

PLAN_GPU_BYTES = 80 * GB  # the card a plan is held against where there is no GPU and no gpu_memory_gb


@dataclass(frozen=True)
class Card:
    """The device a plan is held against: its bytes, and in words."""

    bytes: float
    name: str
    present: bool  # this machine's own GPU


def plan_card(train: TrainConfig, gpu_bytes: int | None = None) -> Card:
    """This machine's GPU (`gpu_bytes`: its memory, read here where None), else `train.gpu_memory_gb`,
    else the 80 GB card."""
    gpu = gpu_memory_bytes() if gpu_bytes is None else gpu_bytes
    if gpu:
        return Card(gpu, f"this machine's {gpu / GB:.0f} GB GPU", True)
    if train.gpu_memory_gb is not None:
        return Card(
            train.gpu_memory_gb * GB, f"a {train.gpu_memory_gb:g} GB device (train.gpu_memory_gb)", False
        )
    return Card(PLAN_GPU_BYTES, "an 80 GB card (no GPU here)", False)


class _PlannedCard:
    """That card as `ablate.hardware.precision.choose_precision` asks of a CUDA device: it runs bf16."""

    @staticmethod
    def is_bf16_supported() -> bool:
        return True


def planned_precision(requested: str, card: Card) -> str:
    """The precision a run of `requested` takes on `card` (decided where every run's precision is,
    `choose_precision`). A card that is not here runs bf16 whatever this machine's CPU does: the
    `ABLATE_NATIVE_BF16` a CPU's capability is forced by does not reach it."""
    if card.present:
        return choose_precision(requested, "cuda", key="train.precision")[0]
    return choose_precision(requested, "cuda", key="train.precision", cuda=_PlannedCard, environ={})[0]


@dataclass(frozen=True)
class StrategyChoice:
    """How a run trains on its devices (`strategy`: "auto" on one device, "ddp", "fsdp", or another
    Lightning name the recipe gave, planned as a replica), its plan a device under it, and the replica's."""

    strategy: str
    plan: MemoryPlan
    replica: MemoryPlan
    card: Card
    world: int

    @property
    def fits(self) -> bool:
        return self.plan.total <= self.card.bytes

    def why(self) -> str:
        """The decision in words, as the plan prints it."""
        need = f"a replica needs {_gb(self.replica.total)} of the {_gb(self.card.bytes)}"
        if self.strategy == "fsdp":
            return f"fsdp on {self.world} GPUs: {need}"
        if self.world == 1:
            return "one GPU"
        return f"{self.strategy} on {self.world} GPUs"


def _gb(value: float) -> str:
    return f"{value / GB:.0f} GB" if value >= 10 * GB else f"{value / GB:.2g} GB"


def _plan(model: ModelConfig, train: TrainConfig, precision: str, shards: int) -> MemoryPlan:
    return memory_plan(
        model,
        precision=precision,
        micro_batch_size=train.micro_batch_size,
        seq_len=train.seq_len,
        shards=shards,
        activation_checkpointing=train.activation_checkpointing,
    )


def choose_strategy(model: ModelConfig, train: TrainConfig, card: Card | None = None) -> StrategyChoice:
    """The strategy `train` trains `model` under and its plan a device (against `card`, default
    `plan_card(train)`): `auto` resolved (one device: itself; several: ddp where a replica fits, else
    fsdp); ddp, fsdp and other names as asked."""
    card = card or plan_card(train)
    precision = planned_precision(train.precision, card)
    world = train.devices * train.num_nodes
    replica = _plan(model, train, precision, 0)
    strategy = train.strategy
    if strategy == "auto" and world > 1:
        strategy = "ddp" if replica.total <= card.bytes else "fsdp"
    plan = _plan(model, train, precision, world) if strategy == "fsdp" else replica
    return StrategyChoice(strategy, plan, replica, card, world)


def strategy_resolved(model: ModelConfig, train: TrainConfig) -> TrainConfig:
    """`train` as it trains: `auto` over several devices replaced by the chosen ddp or fsdp (planned only
    there: one device, or a named strategy, has nothing to decide)."""
    if train.strategy != "auto" or train.devices * train.num_nodes == 1:
        return train
    return replace(train, strategy=choose_strategy(model, train).strategy)


def would_fit(model: ModelConfig, train: TrainConfig, choice: StrategyChoice) -> list[str]:
    """What would fit where `choice` does not, each planned: fsdp on the fewest devices (a world that
    divides the batch), the largest smaller micro-batch (one that divides the batch), activation
    checkpointing."""
    precision, card = choice.plan.precision, choice.card
    per_world = train.batch_tokens // (train.seq_len * train.micro_batch_size)
    options = []
    for world in range(2, min(per_world, MAX_DEVICES) + 1):
        if per_world % world == 0 and _plan(model, train, precision, world).total <= card.bytes:
            options.append(
                f"strategy fsdp on {world} device{'s' * (world > 1)} (train.devices x train.num_nodes)"
            )
            break
    shards = choice.world if choice.strategy == "fsdp" else 0
    per_device = train.batch_tokens // (train.seq_len * choice.world)
    smaller = [m for m in range(1, train.micro_batch_size) if per_device % m == 0]
    fitting = _largest(
        smaller,
        lambda m: _plan(model, replace(train, micro_batch_size=m), precision, shards).total <= card.bytes,
    )
    if fitting is not None:
        options.append(f"train.micro_batch_size {fitting}")
    if not train.activation_checkpointing:
        recomputed = replace(train, activation_checkpointing=True)
        if _plan(model, recomputed, precision, shards).total <= card.bytes:
            options.append("train.activation_checkpointing true")
    return options


def _largest(candidates: list[int], fits: Callable[[int], bool]) -> int | None:
    """The largest of the ascending `candidates` that `fits`, by bisection (activations grow with the
    micro-batch, and each plan of a new micro-batch is a fake forward)."""
    low, high, best = 0, len(candidates) - 1, None
    while low <= high:
        middle = (low + high) // 2
        if fits(candidates[middle]):
            best, low = candidates[middle], middle + 1
        else:
            high = middle - 1
    return best


def refusal(row: str, model: ModelConfig, train: TrainConfig, choice: StrategyChoice) -> str:
    """The one line a plan that does not fit is refused with: the row, the bytes, and what would fit."""
    options = would_fit(model, train, choice)
    fix = f"fits with {', or '.join(options)}" if options else "nothing planned fits: train a smaller size"
    return (
        f"{row}: {_gb(choice.plan.total)} a GPU ({choice.why()}, {choice.plan.precision}) of "
        f"{choice.card.name}; {fix}"
    )


def require_fit(row: str, model: ModelConfig, train: TrainConfig) -> StrategyChoice:
    """`choose_strategy`'s choice, or a UserError (`refusal`) where its plan does not fit the device."""
    choice = choose_strategy(model, train)
    if not choice.fits:
        raise UserError(refusal(row, model, train, choice))
    return choice
