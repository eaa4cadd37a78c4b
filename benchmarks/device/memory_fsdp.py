"""Part (m) of the device check: the memory plan (ablate.model.memory) beside the memory measured, under
FSDP2 on one device. The `small` Transformer and Diff (Table 6's `small` scale: d_model 768, 12 layers,
1,024 x 16 tokens a micro-batch), and Diff again with each block recomputed (activation checkpointing),
each `fully_shard` per decoder block and once at the root over a one-rank group (what `train.strategy:
fsdp` shards), trained `STEPS` AdamW steps on random tokens; on CUDA in bf16 (FSDP2's
`MixedPrecisionPolicy`: bf16 parameters in the products, float32 gradients reduced and float32 shards
kept, the plan's `bf16-mixed`), on a CPU in float32.

`m_memory.csv`, per row: the plan's parameters + gradients + AdamW state, its unsharded buffers, its
activations and its total (`memory_plan(..., shards=1)`), beside the model state measured (the bytes of
every local shard, gradient and optimizer state tensor after the steps) and the last step's peak: on CUDA
`torch.cuda.max_memory_allocated()` over the step (everything the allocator held), on a CPU the model
state plus the profiler's peak growth over the step (ablate.hardware.device.CpuOps); `peak_over_plan` is
their ratio. Written row by row, so a part stopped at its box keeps the rows it finished.

The model and step are written here, not run through `ablate train`: the part measures the sharded model
and one plain AdamW step, with nothing of Lightning's own buffers in the peak.
"""

from __future__ import annotations

import os
import socket

import torch
from csv_rows import append_rows  # benchmarks/device/csv_rows.py
from runs import VARIANTS  # benchmarks/device/runs.py

STEPS = 3  # AdamW steps: the first allocates the optimizer state, the last is measured
ROWS = [(variant, False) for variant in VARIANTS] + [(VARIANTS[1], True)]  # (variant, checkpointed)
COLUMNS = ["variant", "activation_checkpointing", "precision", "device", "micro_batch", "seq_len",
           "planned_state", "measured_state", "planned_unsharded", "planned_activations", "planned_total",
           "measured_peak", "peak_over_plan"]  # fmt: skip


class Recomputed(torch.nn.Module):
    """A block whose activations are recomputed in the backward (torch.utils.checkpoint, non-reentrant)."""

    def __init__(self, block: torch.nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)


def local_bytes(tensors) -> int:
    """Bytes of each tensor's local part (a DTensor's shard on this rank)."""
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def one_rank_group(on_cuda: bool) -> None:
    """A process group of this process alone (nccl on CUDA, gloo on a CPU): what fully_shard's mesh needs."""
    import torch.distributed as dist

    if on_cuda:
        torch.cuda.set_device(0)  # the one card visible (check.py's `visible`)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if on_cuda else "gloo", rank=0, world_size=1)


def measure(run, checkpointed: bool, ops, precision: str) -> dict:
    """One row: `run`'s model sharded and stepped, its plan beside what it held."""
    import torch.nn.functional as F
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from ablate.model.decoder import build_model
    from ablate.model.memory import memory_plan

    on_cuda = ops.device.type == "cuda"
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if on_cuda else None
    model = build_model(run.model, seed=0).to(ops.device)
    if checkpointed:
        model.blocks = torch.nn.ModuleList(Recomputed(block) for block in model.blocks)
    options = {"mp_policy": policy} if policy else {}
    for block in model.blocks:
        fully_shard(block, **options)
    fully_shard(model, **options)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch, seq_len = run.train.micro_batch_size, run.train.seq_len
    tokens = torch.randint(0, run.model.vocab_size, (batch, seq_len), device=ops.device)

    def step() -> None:
        logits = model(tokens)
        F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # gradients kept, as the plan holds them

    for _ in range(STEPS - 1):
        step()
    if on_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    params = list(model.parameters())
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    measured_state = local_bytes(params) + local_bytes(p.grad for p in params) + local_bytes(state)
    if not on_cuda:
        peak = measured_state + ops.peak_bytes(step)
    plan = memory_plan(run.model, precision=precision, micro_batch_size=batch, seq_len=seq_len, shards=1,
                       activation_checkpointing=checkpointed)  # fmt: skip
    return {
        "variant": run.variant, "activation_checkpointing": checkpointed, "precision": precision,
        "device": ops.describe(), "micro_batch": batch, "seq_len": seq_len,
        "planned_state": plan.params + plan.grads + plan.optimizer, "measured_state": measured_state,
        "planned_unsharded": plan.unsharded, "planned_activations": plan.activations, "planned_total": plan.total,
        "measured_peak": peak, "peak_over_plan": f"{peak / plan.total:.3f}",
    }  # fmt: skip


def main(ctx) -> None:
    import torch.distributed as dist

    from ablate.core.registry import load_plugins
    from ablate.hardware.device import device_ops
    from ablate.recipe.loading import load_recipe

    load_plugins()
    recipe_path, scale = (str(ctx.recipe), "train-small") if ctx.dry else ("recipes/table6.yaml", "small")
    ops = device_ops(ctx.device)
    on_cuda = ops.device.type == "cuda"
    precision = "bf16-mixed" if on_cuda else "32-true"
    runs = {r.variant: r for r in load_recipe(recipe_path, scale=scale).runs_for([0], list(VARIANTS))}
    one_rank_group(on_cuda)
    try:
        for variant, checkpointed in ROWS:
            row = measure(runs[variant], checkpointed, ops, precision)
            print(row, flush=True)
            append_rows(ctx.out / "m_memory.csv", [row], COLUMNS)
            if on_cuda:
                torch.cuda.empty_cache()
    finally:
        dist.destroy_process_group()
