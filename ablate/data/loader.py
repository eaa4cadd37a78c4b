"""Token arrays -> micro-batches that every variant sees in the same order.

Train micro-batch `i` is `micro_batch_size` windows of `seq_len + 1` tokens (inputs plus the last target),
chosen by a function of (seed, i) alone: nothing about the model, the process or the batches before it
enters, so every variant with seed k sees the same batches, and a run resumed (or branched) at micro-batch
`global_step * accumulate * world` continues the stream without replaying it: the position in the stream
is the checkpoint's step. Windows cross document boundaries (packing); the end-of-document token marks them.
Two ways of choosing the windows (`data.sampling`, `SAMPLINGS`):

- `permutation` (the default): the training split is cut into `(len - 1) // seq_len` windows at stride
  `seq_len`, so their inputs are disjoint and so are their targets (neighbours share one boundary token,
  the last target of one being the first input of the next), and every token but the first and the last
  `< seq_len` is a target once per pass. Pass `q` reads them in a seeded permutation, a function of
  (seed, q) only; micro-batch `i` takes windows `i * micro_batch_size ...` of the passes read one after
  another. Below one pass nothing is read twice; the next pass is the next permutation.
- `random`: each window starts at a uniform random offset drawn from (seed, i): the sampler before
  `permutation` existed, kept bit for bit so earlier runs can be reproduced. It reads text twice long
  before one pass (`ablate.data.passes.read_twice`).

Validation is `n_batches` micro-batches of non-overlapping windows spread evenly over the val tokens
(so every part of the held-out split counts), the same for every run and seed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from ablate.core.errors import UserError
from ablate.data.config import SAMPLINGS

_TRAIN_SALT = 0x0AB1A7E  # keeps the batch stream apart from other generators seeded with the same seed
_PASS_SALT = 0x9A55E5  # the same for the permutation of each pass


def _check_sizes(n_tokens: int, seq_len: int, micro_batch_size: int, split: str) -> None:
    for name, value in (("seq_len", seq_len), ("micro_batch_size", micro_batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{name}: {value!r} is not a positive integer")
    if n_tokens < seq_len + 1:
        raise UserError(
            f"seq_len: windows of {seq_len + 1} tokens (seq_len + 1) do not fit in the "
            f"{n_tokens}-token {split} split; lower seq_len or use a larger data.source"
        )


def _check_stream(tokens: np.ndarray, index: int, seq_len: int, micro_batch_size: int, seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UserError(f"seed: {seed!r} is not a non-negative integer")
    if index < 0:
        raise ValueError(f"micro-batch index {index} < 0")
    _check_sizes(len(tokens), seq_len, micro_batch_size, "train")


def _windows(tokens: np.ndarray, starts: np.ndarray, width: int) -> torch.Tensor:
    rows = np.stack([np.asarray(tokens[s : s + width]) for s in starts.tolist()])
    return torch.from_numpy(rows.astype(np.int64))


def train_batch(
    tokens: np.ndarray, index: int, *, seq_len: int, micro_batch_size: int, seed: int
) -> torch.Tensor:
    """Train micro-batch number `index` of the random sampler (windows at random offsets): LongTensor
    (micro_batch_size, seq_len + 1)."""
    _check_stream(tokens, index, seq_len, micro_batch_size, seed)
    rng = np.random.default_rng([_TRAIN_SALT, seed, index])
    starts = rng.integers(0, len(tokens) - seq_len, size=micro_batch_size)  # last start: len - (seq_len+1)
    return _windows(tokens, starts, seq_len + 1)


def windows_per_pass(n_tokens: int, seq_len: int) -> int:
    """How many windows of `seq_len + 1` tokens at stride `seq_len` a split of `n_tokens` holds."""
    return (n_tokens - 1) // seq_len


def pass_order(n_windows: int, seed: int, pass_number: int) -> np.ndarray:
    """The order in which pass `pass_number` reads the split's `n_windows` windows: a permutation seeded by
    (seed, pass_number) alone."""
    return np.random.default_rng([_PASS_SALT, seed, pass_number]).permutation(n_windows)


class PassOrders:
    """The window numbers of the permutation sampler's stream, one pass after another; it keeps the order
    of the pass it read last (a permutation is drawn once per pass, not once per micro-batch)."""

    def __init__(self, n_windows: int, seed: int):
        self.n_windows, self.seed = n_windows, seed
        self._pass, self._order = -1, np.empty(0, dtype=np.int64)

    def order(self, pass_number: int) -> np.ndarray:
        if pass_number != self._pass:
            self._pass, self._order = pass_number, pass_order(self.n_windows, self.seed, pass_number)
        return self._order

    def windows(self, first: int, count: int) -> np.ndarray:
        """Window numbers `first, ..., first + count - 1` of the stream (across a pass's end if need be)."""
        picked = []
        while count > 0:
            pass_number, at = divmod(first, self.n_windows)
            take = min(count, self.n_windows - at)
            picked.append(self.order(pass_number)[at : at + take])
            first, count = first + take, count - take
        return np.concatenate(picked)


def permutation_batch(
    tokens: np.ndarray,
    index: int,
    *,
    seq_len: int,
    micro_batch_size: int,
    seed: int,
    orders: PassOrders | None = None,
) -> torch.Tensor:
    """Train micro-batch number `index` of the permutation sampler: LongTensor (micro_batch_size,
    seq_len + 1). `orders`: the stream's `PassOrders`, kept between calls (built here if not given)."""
    _check_stream(tokens, index, seq_len, micro_batch_size, seed)
    orders = orders or PassOrders(windows_per_pass(len(tokens), seq_len), seed)
    picked = orders.windows(index * micro_batch_size, micro_batch_size)
    return _windows(tokens, picked * seq_len, seq_len + 1)


def micro_batch(
    tokens: np.ndarray, index: int, *, seq_len: int, micro_batch_size: int, seed: int, sampling: str
) -> torch.Tensor:
    """Train micro-batch number `index` under `sampling` (`SAMPLINGS`)."""
    if sampling == "random":
        return train_batch(tokens, index, seq_len=seq_len, micro_batch_size=micro_batch_size, seed=seed)
    if sampling == "permutation":
        return permutation_batch(tokens, index, seq_len=seq_len, micro_batch_size=micro_batch_size, seed=seed)
    raise UserError(f"data.sampling: {sampling!r} is not one of {', '.join(SAMPLINGS)}")


def micro_batch_numbers(start: int, stop: int | None, rank: int, world_size: int) -> range:
    """The train micro-batch numbers a rank yields: start + rank, start + rank + world_size, ... (up to
    `stop`, or practically forever)."""
    stop = stop if stop is not None else 2**62
    return range(start + rank, max(stop, start + rank), world_size)


def this_workers_share(indices: range) -> range:
    """Inside a DataLoader worker, its round-robin share of `indices` (the DataLoader reassembles the
    order); the whole of them in the main process."""
    info = get_worker_info()
    return indices[info.id :: info.num_workers] if info is not None else indices


class MicroBatchStream(IterableDataset):
    """Train micro-batches `start, start + 1, ...` (up to `stop`, or forever) as an IterableDataset; a
    subclass says what micro-batch `i` is (`batch`), from its own source (a corpus's tokens, a task).

    Use it with `DataLoader(ds, batch_size=None)`. With `world_size` > 1, rank r takes micro-batches
    start + r, start + r + world_size, ...; DataLoader workers split a rank's share round-robin, which the
    DataLoader reassembles in order.
    """

    def __init__(
        self,
        *,
        seq_len: int,
        micro_batch_size: int,
        seed: int,
        start: int = 0,
        stop: int | None = None,
        rank: int = 0,
        world_size: int = 1,
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} not in [0, {world_size})")
        self.seq_len, self.micro_batch_size, self.seed = seq_len, micro_batch_size, seed
        self.start, self.stop, self.rank, self.world_size = start, stop, rank, world_size

    def batch(self, i: int) -> Any:
        """Micro-batch number `i`."""
        raise NotImplementedError

    def indices(self) -> range:
        """The micro-batch numbers this rank yields (all workers together)."""
        return micro_batch_numbers(self.start, self.stop, self.rank, self.world_size)

    def __len__(self) -> int:
        if self.stop is None:
            raise TypeError(f"an endless {type(self).__name__} has no length; give stop")
        return len(self.indices())

    def __iter__(self):
        for i in this_workers_share(self.indices()):
            yield self.batch(i)


class TrainBatches(MicroBatchStream):
    """A corpus's train micro-batches under `sampling` (`SAMPLINGS`: `permutation_batch`, `train_batch`);
    `stream`: seq_len, micro_batch_size, seed and the stream's start, stop, rank, world_size
    (`MicroBatchStream`)."""

    def __init__(self, tokens: np.ndarray, *, sampling: str = "permutation", **stream: Any):
        super().__init__(**stream)
        _check_sizes(len(tokens), self.seq_len, self.micro_batch_size, "train")
        if sampling not in SAMPLINGS:
            raise UserError(f"data.sampling: {sampling!r} is not one of {', '.join(SAMPLINGS)}")
        self.tokens, self.sampling = tokens, sampling
        self.orders = PassOrders(windows_per_pass(len(tokens), self.seq_len), self.seed)

    def batch(self, i: int) -> torch.Tensor:
        sizes = dict(seq_len=self.seq_len, micro_batch_size=self.micro_batch_size, seed=self.seed)
        if self.sampling == "random":
            return train_batch(self.tokens, i, **sizes)
        return permutation_batch(self.tokens, i, **sizes, orders=self.orders)


def val_starts(n_tokens: int, *, seq_len: int, micro_batch_size: int, n_batches: int) -> np.ndarray:
    """Start offsets of the validation windows: n_batches * micro_batch_size, evenly spread, disjoint."""
    _check_sizes(n_tokens, seq_len, micro_batch_size, "val")
    if isinstance(n_batches, bool) or not isinstance(n_batches, int) or n_batches < 1:
        raise UserError(f"val_batches: {n_batches!r} is not a positive integer")
    width, count = seq_len + 1, n_batches * micro_batch_size
    if count * width > n_tokens:
        most = n_tokens // (width * micro_batch_size)
        raise UserError(
            f"val_batches: {n_batches} micro-batches of {micro_batch_size} x {width} tokens need "
            f"{count * width} validation tokens but the val split has {n_tokens}; use at most "
            f"{most} (or a shorter seq_len, or a larger data.val_fraction)"
        )
    if count == 1:
        return np.zeros(1, dtype=np.int64)
    stride = (n_tokens - width) // (count - 1)  # >= width because count * width <= n_tokens
    return np.arange(count, dtype=np.int64) * stride


class ValBatches(Dataset):
    """The fixed validation micro-batches: item j is LongTensor (micro_batch_size, seq_len + 1)."""

    def __init__(self, tokens: np.ndarray, *, seq_len: int, micro_batch_size: int, n_batches: int):
        self.tokens, self.seq_len, self.micro_batch_size = tokens, seq_len, micro_batch_size
        self.starts = val_starts(
            len(tokens), seq_len=seq_len, micro_batch_size=micro_batch_size, n_batches=n_batches
        ).reshape(n_batches, micro_batch_size)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, j: int) -> torch.Tensor:
        return _windows(self.tokens, self.starts[j], self.seq_len + 1)
