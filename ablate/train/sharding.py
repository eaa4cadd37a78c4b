"""`train.strategy: fsdp`: the model sharded with FSDP2 over every device (data parallel), through
Lightning's ModelParallelStrategy, whose contract is that the LightningModule applies the parallelism in
`configure_model` (ablate.train.module calls `shard`).

Groups, as torchtitan's `parallelize` makes them: `fully_shard` on each decoder block (its parameters
all-gathered just before its forward and freed after, gradients reduce-scattered after its backward), then
once at the root for what is left (embedding, final norm, LM head). The recipe's precision is FSDP2's
`MixedPrecisionPolicy` (`policy`), not Lightning's autocast or module cast, because FSDP2 casts the
gathered parameters itself: 32-true gathers and reduces float32; bf16-mixed keeps float32 shards
(AdamW's state float32) and gathers them in bf16 for the products, reducing gradients in float32;
bf16-true holds the shards themselves in bf16.

A parameter a component keeps in float32 whatever the model's dtype (the differential attention's λ
vectors, Eq. 2) is found as the component itself says it: the parameters that stay float32 when the model
is built with bf16 as the default dtype (`kept_float32`, on the meta device: nothing is allocated). FSDP2
refuses a group whose parameters differ in dtype, so under the bf16 precisions each module holding such a
parameter gets its own group: its children are one group in the block's policy, the module itself (its
own float32 parameters) a group gathered and reduced in float32 (`_float32_group`). λ is then computed in
float32 as on one device, at the cost of one more all-gather per layer of a few hundred bytes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from ablate.train.config import TrainConfig

STRATEGY = "fsdp"  # train.strategy's value for this module's strategy
BF16 = ("bf16-mixed", "bf16-true")


def sharded(cfg: TrainConfig) -> bool:
    """Does the run train under FSDP2 (`train.strategy: fsdp`, as decided)?"""
    return cfg.strategy == STRATEGY


def description(cfg: TrainConfig, precision: str) -> str:
    """The run's sharding as its tag says it (ablate.store.names.SHARDING)."""
    world = cfg.devices * cfg.num_nodes
    if sharded(cfg):
        ranks = f"{world} rank{'s' if world > 1 else ''}"
        return f"fsdp over {ranks} (FSDP2 per block and root, {precision})"
    return f"ddp over {world} ranks (a replica each)" if world > 1 else "none"


def lightning_strategy(cfg: TrainConfig) -> Any:
    """The Lightning strategy of an fsdp run: ModelParallelStrategy with every rank in one data-parallel
    dimension (no tensor parallelism), its checkpoints sharded (each rank writes its own) and written
    atomically (ablate.train.checkpoint_files)."""
    from ablate.train.checkpoint_files import AtomicShardedStrategy

    world = cfg.devices * cfg.num_nodes
    return AtomicShardedStrategy(data_parallel_size=world, tensor_parallel_size=1)


def trainer_precision(precision: str) -> str:
    """The Lightning precision of an fsdp run: 32-true, FSDP2's policy does the rest (`policy`)."""
    return "32-true" if precision in BF16 else precision


def policy(precision: str) -> Any:
    """FSDP2's MixedPrecisionPolicy for the run's (resolved) Lightning precision."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "bf16-mixed":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()  # 32-true, bf16-true: gathered and reduced in the shards' own dtype


def kept_float32(model: nn.Module) -> set[str]:
    """Names of the parameters `model`'s components keep in float32 whatever the default dtype: those a
    build of the same config on `meta` with bf16 as the default dtype leaves float32."""
    from ablate.model.decoder import build_model

    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        probe = build_model(model.config, device="meta")
    finally:
        torch.set_default_dtype(before)
    return {name for name, p in probe.named_parameters() if p.dtype == torch.float32}


def shard(model: nn.Module, mesh: Any, precision: str) -> None:
    """FSDP2 on `model` (a DecoderLM) over `mesh`, in place: each block, then the root (module docstring).
    Under bf16-true the model is cast to bf16 first, but for the parameters its components keep float32."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if isinstance(model, FSDPModule):
        return  # configure_model runs again for a validation after fit: sharded once
    keep = kept_float32(model) if precision in BF16 else set()
    if precision == "bf16-true":
        for name, p in model.named_parameters():
            if name not in keep:
                p.data = p.data.to(torch.bfloat16)
    mp = policy(precision)
    holders = {name.rpartition(".")[0] for name in keep}  # the modules that hold them directly
    for i, block in enumerate(model.blocks):
        for name, module in block.named_modules(prefix=f"blocks.{i}"):
            if name in holders:
                _float32_group(module, mesh, mp)
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)  # the rest: embedding, final norm, LM head


def _float32_group(module: nn.Module, mesh: Any, mp: Any) -> None:
    """`module`'s children that hold parameters as one group in the block's policy, and the module's own
    (float32) parameters as a group gathered and reduced in float32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    children = [c for c in module.children() if any(True for _ in c.parameters())]
    if children:
        fully_shard(children, mesh=mesh, mp_policy=mp)
    fully_shard(module, mesh=mesh, mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.float32))


def grad_norm(grads: list[torch.Tensor], reduce: Any) -> float:
    """The global gradient norm: under FSDP2 each rank holds a shard of each gradient (a DTensor), so the
    squares of the local shards are summed over the ranks (`reduce`: the strategy's sum); otherwise each
    rank holds the whole (all-reduced) gradients."""
    from torch.distributed.tensor import DTensor

    if not grads:
        return 0.0
    if not any(isinstance(g, DTensor) for g in grads):
        return float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
    local = torch.stack([(g.to_local() if isinstance(g, DTensor) else g).float().pow(2).sum() for g in grads])
    return float(reduce(local.sum(), reduce_op="sum").sqrt())


@contextlib.contextmanager
def gathered(module: nn.Module) -> Iterator[None]:
    """`module`'s parameters whole inside the block (every FSDP2 group within it all-gathered, then
    resharded); nothing to do where it is not sharded. For reading them outside a forward (λ's value)."""
    from torch.distributed.fsdp import FSDPModule

    groups = [m for m in module.modules() if isinstance(m, FSDPModule)]
    for group in groups:
        group.unshard()
    try:
        yield
    finally:
        for group in groups:
            group.reshard()
