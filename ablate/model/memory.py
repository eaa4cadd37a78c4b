"""A run's memory plan: the bytes one device holds while it trains, known before launch.

- Parameters, gradients and AdamW's two moments: exact, from the model's own tensors (one block's
  parameters times `n_layers`, plus the embedding, final norm and LM head, as `ablate.model.cost` counts
  them), each in the dtype the run trains it in (`-true` precisions cast the model; `-mixed` ones keep
  float32 parameters and autocast the products). Every device holds a whole replica (DDP).
- Activations per micro-batch: what autograd saves for the backward, read off one block's forward and the
  head's (final norm, LM head, loss) on fake tensors (`FakeTensorMode`: shapes and dtypes, no memory), under
  the run's autocast; the blocks' times `n_layers`, plus the head's, plus the loss's two logits-sized
  gradients, the largest tensors the backward makes at once. Checked against the profiler's peak of a real
  step on a CPU (tests/ablate/test_memory_plan.py).

Written here rather than taken from a library: the estimators in use (e.g. DeepSpeed's
`estimate_zero3_model_states_mem_needs`) count parameters of a built model and leave activations out,
and a model here is never built whole to be planned.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from ablate.core.tables import si
from ablate.hardware.precision import autocast, parameter_dtype
from ablate.model.config import ModelConfig
from ablate.model.decoder import Block, block_makers, model_multipliers

GB = 1e9


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes on one device: its model state and one micro-batch's activations."""

    params: int
    grads: int
    optimizer: int
    activations: int
    precision: str
    micro_batch_size: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations

    def row(self) -> str:
        """One line: what `ablate check` prints for a row."""
        return (
            f"params {si(self.params)}B, grads {si(self.grads)}B, AdamW {si(self.optimizer)}B, activations "
            f"{si(self.activations)}B (micro-batch {self.micro_batch_size}): {si(self.total)}B"
        )


def memory_plan(model: ModelConfig, *, precision: str, micro_batch_size: int, seq_len: int) -> MemoryPlan:
    """The plan of one device training `model` in a resolved `precision` on micro-batches of
    `micro_batch_size` sequences of `seq_len` tokens, every device a replica."""
    key = (json.dumps(model.to_dict(), sort_keys=True, default=str), precision, micro_batch_size, seq_len)
    if key not in _PLANS:  # one fake forward per model and shape (0.1-0.5 s), however often it is checked
        _PLANS[key] = _plan(model, precision, micro_batch_size, seq_len)
    return _PLANS[key]


_PLANS: dict[tuple, MemoryPlan] = {}


def _plan(model: ModelConfig, precision: str, micro_batch_size: int, seq_len: int) -> MemoryPlan:
    dtype = parameter_dtype(precision)
    with FakeTensorMode(), _default_dtype(dtype):
        make = block_makers(model)
        block = Block(model, 0, make, model_multipliers(model))
        head = _Head(model, make)
        embedding = 0 if model.tie_embeddings else model.vocab_size * model.d_model * dtype.itemsize
        state = model.n_layers * _bytes(block, dtype) + _bytes(head, dtype) + embedding
        tensors = model.n_layers * _count(block) + _count(head) + (0 if model.tie_embeddings else 1)
        x = torch.empty(micro_batch_size, seq_len, model.d_model, dtype=dtype, requires_grad=True)
        tokens = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
        with autocast("cpu", precision):
            per_block = _saved(block, x)
            per_head = _saved(head, x, tokens)
    # The loss's backward holds two float32 gradients of the logits' size at once (log-softmax's and the
    # logits'): the largest the backward makes.
    logits_grad = 2 * micro_batch_size * seq_len * model.vocab_size * 4
    token_ids = micro_batch_size * seq_len * 8  # what the embedding saves
    return MemoryPlan(
        params=state,
        grads=state,
        optimizer=2 * state + 4 * tensors,  # two moments, and a float32 step count per tensor
        activations=model.n_layers * per_block + per_head + logits_grad + token_ids,
        precision=precision,
        micro_batch_size=micro_batch_size,
    )


class _Head(nn.Module):
    """The final norm, the LM head and the loss: what follows the blocks."""

    def __init__(self, model: ModelConfig, make: dict) -> None:
        super().__init__()
        self.final_norm = make["norm"](dim=model.d_model)
        self.lm_head = nn.Linear(model.d_model, model.vocab_size, bias=False)

    def forward(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.final_norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())


def _bytes(module: nn.Module, dtype: torch.dtype) -> int:
    """Bytes of `module`'s parameters once cast to `dtype` as training casts it (`module.to(dtype)`: every
    floating-point parameter)."""
    return sum(
        p.numel() * (dtype.itemsize if p.is_floating_point() else p.element_size())
        for p in module.parameters()
    )


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Modules built in `dtype` (a fake module cannot be cast after it is built)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _count(module: nn.Module) -> int:
    return sum(1 for _ in module.parameters())


def _saved(module: nn.Module, *inputs: torch.Tensor) -> int:
    """Bytes of the tensors autograd saves in `module(*inputs)`, each storage once, its parameters left out
    (a cast copy of one, under autocast, counts: it is held until the backward)."""
    params = {p.untyped_storage()._cdata for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in params:
            seen[storage._cdata] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(*inputs)
    return sum(seen.values())
