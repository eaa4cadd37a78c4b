"""The memory plan's sharded model state (ablate.model.memory.shard_state) against FSDP2 itself: two gloo
processes each `fully_shard` a real ablate model per block and at the root, step a real AdamW once, and
sum their local tensors' bytes (parameters' `to_local()`, gradients', the optimizer state's)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ablate.model.config import ModelConfig
from ablate.model.memory import memory_plan, shard_state

WORLD = 2
# Odd vocabulary (the embedding's and LM head's dim 0 split 26 / 25) and lambda_proj's 6 rows of diff_v2.
ATTENTIONS = ("softmax", "diff", "diff_v2")
MODEL = {"vocab_size": 51, "d_model": 24, "n_layers": 2, "head_dim": 4, "attention_backend": "math"}


def _local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def _rank(rank: int, port: int, out: str) -> None:
    from ablate.core.registry import load_plugins

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        load_plugins()
        for attention in ATTENTIONS:  # one pair of processes for every model
            Path(out, f"{attention}-{rank}.json").write_text(json.dumps(_sharded_step(attention)))
    finally:
        dist.destroy_process_group()


def _sharded_step(attention: str) -> dict:
    from torch.distributed.fsdp import fully_shard

    from ablate.model.decoder import build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig.from_dict({**MODEL, "attention": {"name": attention}}))
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, MODEL["vocab_size"], (2, 16))
    logits = model(tokens)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    optimizer.step()
    params = list(model.parameters())
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    sums = {
        "params": sum(_local_bytes(p) for p in params),
        "grads": sum(_local_bytes(p.grad) for p in params),
        "optimizer": sum(_local_bytes(t) for t in state),
        "sharded": all(hasattr(p, "to_local") for p in params),
    }
    return sums


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_sharded_state_is_each_ranks_local_tensors(tmp_path):
    mp.spawn(_rank, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    for attention in ATTENTIONS:
        _compare(attention, tmp_path)


def _compare(attention: str, folder: Path) -> None:
    config = ModelConfig.from_dict({**MODEL, "attention": {"name": attention}})
    measured = [json.loads((folder / f"{attention}-{r}.json").read_text()) for r in range(WORLD)]
    assert all(m.pop("sharded") for m in measured)
    for rank, real in enumerate(measured):
        planned = shard_state(config, precision="32-true", shards=WORLD, rank=rank)
        assert planned == (real["params"], real["grads"], real["optimizer"]), (rank, planned, real)
    assert measured[0]["params"] > measured[1]["params"]  # the odd rows fall to rank 0
    plan = memory_plan(config, precision="32-true", micro_batch_size=2, seq_len=16, shards=WORLD)
    largest = max(measured, key=lambda m: m["params"])
    assert (plan.params, plan.grads, plan.optimizer) == (
        largest["params"],
        largest["grads"],
        largest["optimizer"],
    )
    replica = memory_plan(config, precision="32-true", micro_batch_size=2, seq_len=16)
    assert replica.params == sum(m["params"] for m in measured)  # the shards add up to the whole model
