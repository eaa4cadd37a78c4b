"""A run's memory plan: the bytes one device holds while it trains, known before launch.

- Parameters, gradients and AdamW's two moments: exact, from the model's own tensors (one block's
  parameters times `n_layers`, plus the embedding, final norm and LM head, as `ablate.model.cost` counts
  them), each in the dtype the run trains it in (`-true` precisions cast the model; `-mixed` ones keep
  float32 parameters and autocast the products).
  - A replica (one device, or DDP): every device holds all of them.
  - FSDP2 over W ranks (`shards=W`): `fully_shard` splits every parameter on dim 0 as `torch.chunk` does,
    ceil(dim0 / W) rows a chunk, rank r the r-th chunk (empty past the end); its storage is padded to
    the first chunk's rows (torch/distributed/fsdp/_fully_shard/_fsdp_param.py, `_init_sharded_param`).
    The sharded gradient has the local shard's shape, and AdamW's moments are `zeros_like` it; each
    parameter keeps its float32 `step` on every rank. `shard_state` gives one rank's local bytes exactly;
    the plan holds rank 0's, the largest (its chunk always has the padded rows, so it is also what every
    rank's padded storage takes).
  - What FSDP2 holds unsharded at once (`unsharded`), assumed: the all-gathered parameters of two
    blocks (the one computing and the next, prefetched) in the compute dtype, and their unsharded
    gradients before the reduce-scatter in the parameters' dtype (float32 under `-mixed`: the reduce
    dtype torchtitan's policy uses); plus the root group (embedding, final norm, LM head), which
    `fully_shard` keeps unsharded from the forward to the backward (a root is not resharded after its
    forward) and whose gradients are reduce-scattered only when the whole backward has run.
- Activations per micro-batch: what autograd saves for the backward, read off one block's forward and the
  head's (final norm, LM head, loss) on fake tensors (`FakeTensorMode`: shapes and dtypes, no memory), under
  the run's autocast; the blocks' times `n_layers`, plus the head's, plus the loss's two logits-sized
  gradients, the largest tensors the backward makes at once. With activation checkpointing (per block)
  each block keeps only its input, and one block's activations are alive again while it is recomputed
  and differentiated; the head's backward is over by then, so the larger of the two phases counts
  (within 15% of the profiler's peak at both tested sizes; their sum was 51-78% above it). Checked against the profiler's peak of a real step on a CPU, with and without
  checkpointing (tests/ablate/test_memory_plan.py), and the sharded state against a real 2-rank
  `fully_shard` on gloo (tests/ablate/test_memory_plan_fsdp.py).

Written here rather than taken from a library: the estimators in use (e.g. DeepSpeed's
`estimate_zero3_model_states_mem_needs`) count parameters of a built model and leave activations and
FSDP2's padding and in-flight buffers out, and a model here is never built whole to be planned.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from ablate.core.tables import si
from ablate.hardware.precision import autocast, compute_dtype, parameter_dtype
from ablate.model.config import ModelConfig
from ablate.model.decoder import Block, block_makers, model_multipliers

GB = 1e9
STEP_BYTES = 4  # AdamW's float32 step count, one per parameter tensor
UNSHARDED_BLOCKS = 2  # the block computing and the next one, prefetched (FSDP2's default prefetch)


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes on one device: its model state (sharded over `shards` ranks under fsdp; 0: a replica), what
    FSDP2 holds unsharded at once, and one micro-batch's activations."""

    params: int
    grads: int
    optimizer: int
    activations: int
    precision: str
    micro_batch_size: int
    unsharded: int = 0
    shards: int = 0
    activation_checkpointing: bool = False

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.unsharded + self.activations

    def row(self) -> str:
        """One line: what `ablate check` prints for a row."""
        gathered = f", unsharded in flight {si(self.unsharded)}B" if self.shards else ""
        recompute = ", checkpointed" if self.activation_checkpointing else ""
        return (
            f"params {si(self.params)}B, grads {si(self.grads)}B, AdamW {si(self.optimizer)}B{gathered}, "
            f"activations {si(self.activations)}B (micro-batch {self.micro_batch_size}{recompute}): "
            f"{si(self.total)}B"
        )


@dataclass(frozen=True)
class _State:
    """The model's parameter tensors, as (shape, bytes an element) in the dtype it trains them in: one
    block's (every block alike) and the root's (embedding, final norm, LM head)."""

    block: tuple[tuple[tuple[int, ...], int], ...]
    root: tuple[tuple[tuple[int, ...], int], ...]
    n_layers: int

    def tensors(self) -> Iterator[tuple[tuple[int, ...], int]]:
        for _ in range(self.n_layers):
            yield from self.block
        yield from self.root


def memory_plan(
    model: ModelConfig,
    *,
    precision: str,
    micro_batch_size: int,
    seq_len: int,
    shards: int = 0,
    activation_checkpointing: bool = False,
) -> MemoryPlan:
    """The plan of one device training `model` in a resolved `precision` on micro-batches of
    `micro_batch_size` sequences of `seq_len` tokens: a replica (`shards` 0), or FSDP2's largest rank of
    `shards`; activations kept, or recomputed per block (`activation_checkpointing`)."""
    state = _state(model, precision)
    per_block, per_head, block_input = _activations(model, precision, micro_batch_size, seq_len)
    # The loss's backward holds two float32 gradients of the logits' size at once (log-softmax's and the
    # logits'): the largest the backward makes.
    logits_grad = 2 * micro_batch_size * seq_len * model.vocab_size * 4
    token_ids = micro_batch_size * seq_len * 8  # what the embedding saves
    if activation_checkpointing:
        # Every block's input kept; the head's backward (its logits' gradients) is over before the last
        # block is recomputed, so the larger of the two phases counts, not their sum.
        activations = model.n_layers * block_input + max(per_block, per_head + logits_grad)
    else:
        activations = model.n_layers * per_block + per_head + logits_grad
    if shards:
        params, grads, optimizer = shard_state(model, precision=precision, shards=shards, rank=0)
        unsharded = _unsharded(state, precision, shards)
    else:
        params = sum(math.prod(shape) * size for shape, size in state.tensors())
        grads, optimizer = params, 2 * params + STEP_BYTES * sum(1 for _ in state.tensors())
        unsharded = 0
    return MemoryPlan(
        params=params,
        grads=grads,
        optimizer=optimizer,
        activations=activations + token_ids,
        precision=precision,
        micro_batch_size=micro_batch_size,
        unsharded=unsharded,
        shards=shards,
        activation_checkpointing=activation_checkpointing,
    )


def shard_rows(dim0: int, shards: int, rank: int) -> int:
    """Rows of `rank`'s chunk of a dim 0 of `dim0` rows split as `torch.chunk(t, shards)` splits it
    (FSDP2's `_chunk_with_empty`): ceil(dim0 / shards) rows a chunk, the last ones short or empty."""
    chunk = -(-dim0 // shards)
    return max(0, min(chunk, dim0 - rank * chunk))


def shard_state(model: ModelConfig, *, precision: str, shards: int, rank: int) -> tuple[int, int, int]:
    """(parameters, gradients, AdamW state): the bytes of `rank`'s local tensors under FSDP2 over
    `shards` ranks (`p.to_local()`, its gradient's, its optimizer state's)."""
    params = count = 0
    for shape, size in _state(model, precision).tensors():
        params += shard_rows(shape[0], shards, rank) * math.prod(shape[1:]) * size
        count += 1
    return params, params, 2 * params + STEP_BYTES * count


def _unsharded(state: _State, precision: str, shards: int) -> int:
    """Bytes FSDP2 holds all-gathered at once (the module docstring's assumptions): two blocks' and the
    root's parameters in the compute dtype, and their gradients in the parameters' dtype, every tensor
    at its padded size (ceil(dim0 / shards) x shards rows)."""
    gathered = compute_dtype(precision).itemsize

    def padded(tensors: tuple[tuple[tuple[int, ...], int], ...]) -> tuple[int, int]:
        elements = [-(-shape[0] // shards) * shards * math.prod(shape[1:]) for shape, _ in tensors]
        return sum(elements) * gathered, sum(n * size for n, (_, size) in zip(elements, tensors))

    block_params, block_grads = padded(state.block)
    root_params, root_grads = padded(state.root)
    return min(UNSHARDED_BLOCKS, state.n_layers) * (block_params + block_grads) + root_params + root_grads


def _key(model: ModelConfig, *rest: object) -> tuple:
    return (json.dumps(model.to_dict(), sort_keys=True, default=str), *rest)


_STATES: dict[tuple, _State] = {}
_ACTIVATIONS: dict[tuple, tuple[int, int, int]] = {}


@contextlib.contextmanager
def _fake_block_and_head(model: ModelConfig, dtype: torch.dtype) -> Iterator[tuple[Block, _Head]]:
    """One block and the head of `model` in `dtype` on fake tensors (shapes and dtypes, no memory), used
    inside the fake mode."""
    with FakeTensorMode(), _default_dtype(dtype):
        make = block_makers(model)
        yield Block(model, 0, make, model_multipliers(model)), _Head(model, make)


def _state(model: ModelConfig, precision: str) -> _State:
    key = _key(model, precision)
    if key not in _STATES:
        dtype = parameter_dtype(precision)
        with _fake_block_and_head(model, dtype) as (block, head):
            pass
        embedding = () if model.tie_embeddings else (((model.vocab_size, model.d_model), dtype.itemsize),)
        _STATES[key] = _State(_shapes(block, dtype), embedding + _shapes(head, dtype), model.n_layers)
    return _STATES[key]


def _activations(
    model: ModelConfig, precision: str, micro_batch_size: int, seq_len: int
) -> tuple[int, int, int]:
    """(one block's saved bytes, the head's, one block's input's) for a micro-batch: one fake forward per
    model and shape (0.1-0.5 s), however often it is planned."""
    key = _key(model, precision, micro_batch_size, seq_len)
    if key not in _ACTIVATIONS:
        dtype = parameter_dtype(precision)
        with _fake_block_and_head(model, dtype) as (block, head):
            x = torch.empty(micro_batch_size, seq_len, model.d_model, dtype=dtype, requires_grad=True)
            tokens = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
            with autocast("cpu", precision):
                per_block = _saved(block, x)
                per_head = _saved(head, x, tokens)
        _ACTIVATIONS[key] = (per_block, per_head, x.numel() * dtype.itemsize)
    return _ACTIVATIONS[key]


class _Head(nn.Module):
    """The final norm, the LM head and the loss: what follows the blocks."""

    def __init__(self, model: ModelConfig, make: dict) -> None:
        super().__init__()
        self.final_norm = make["norm"](dim=model.d_model)
        self.lm_head = nn.Linear(model.d_model, model.vocab_size, bias=False)

    def forward(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.final_norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())


def _shapes(module: nn.Module, dtype: torch.dtype) -> tuple[tuple[tuple[int, ...], int], ...]:
    """`module`'s parameters as (shape, bytes an element) once cast to `dtype` as training casts it
    (`module.to(dtype)`: every floating-point parameter)."""
    return tuple(
        (tuple(p.shape), dtype.itemsize if p.is_floating_point() else p.element_size())
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
