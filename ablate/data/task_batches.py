"""A task (registry kind `task`) -> micro-batches, the way `ablate.data.loader` makes them from a corpus.

Train micro-batch i holds train samples i*B .. i*B + B - 1 of the run's seed (B = micro_batch_size), so it
depends on (seed, i) alone: every variant with seed k sees the same samples, and a resumed run continues
the stream. Validation holds held-out samples 0 .. val_batches*B - 1, the same for every run and seed.

A batch is a dict of tensors:
    tokens       (B, seq_len + 1)  samples right-padded with PAD (0)
    loss_mask    (B, seq_len)      targets (tokens[:, 1:]) that are not padding
    answer_mask  (B, seq_len)      targets that are answers
    cell         (B,)              index into task.cells(): what the sample is an instance of
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from ablate.core import registry
from ablate.core.errors import UserError
from ablate.data.config import DataConfig, parse_data_config
from ablate.data.loader import MicroBatchStream
from ablate.data.tasks import PAD, Sample, Task

LOSS_ON = ("answers", "all")


def task_spec(data_cfg: DataConfig | Mapping[str, Any] | None) -> Any:
    """The `data.task` spec of a data section, or None when the data is a corpus."""
    return parse_data_config(data_cfg).task


def build_task(data_cfg: DataConfig | Mapping[str, Any]) -> Task:
    registry.load_plugins()
    task = registry.build("task", task_spec(data_cfg), key="data.task")
    if not isinstance(task, Task):
        raise UserError(f"data.task: {type(task).__name__} is not an ablate.data.tasks.Task; subclass it")
    return task


def check_fits(task: Task, *, seq_len: int, vocab_size: int) -> None:
    if task.max_length > seq_len + 1:
        raise UserError(
            f"train.seq_len: the task's samples reach {task.max_length} tokens, more than seq_len + 1 "
            f"= {seq_len + 1}; set train.seq_len >= {task.max_length - 1} or shorten the task's lengths"
        )
    if task.vocab_size > vocab_size:
        raise UserError(
            f"model.vocab_size: {vocab_size} is smaller than the task's vocabulary ({task.vocab_size}); "
            f"set model.vocab_size >= {task.vocab_size}"
        )


def _cell_key(tags: Mapping[str, Any]) -> str:
    return json.dumps(dict(tags), sort_keys=True, default=str)


def collate(task: Task, samples: Sequence[Sample], width: int) -> dict[str, torch.Tensor]:
    """Samples -> one batch dict (see the module docstring), each row `width` tokens."""
    index = {_cell_key(c): i for i, c in enumerate(task.cells())}
    if any("_" in str(key) or "/" in str(key) for c in task.cells() for key in c):
        raise ValueError(
            f"{type(task).__name__}: tag keys may not contain '_' or '/' (metric names are key_value)"
        )
    tokens = torch.full((len(samples), width), PAD, dtype=torch.long)
    answers = torch.zeros((len(samples), width - 1), dtype=torch.bool)
    cells = torch.empty(len(samples), dtype=torch.long)
    for row, s in enumerate(samples):
        if len(s.tokens) > width:
            raise UserError(
                f"data.task: a sample of {len(s.tokens)} tokens does not fit {width} (train.seq_len + 1)"
            )
        tokens[row, : len(s.tokens)] = torch.from_numpy(s.tokens)
        answers[row, torch.from_numpy(s.answer_positions) - 1] = True  # target t is token t + 1
        key = _cell_key(s.tags)
        if key not in index:
            raise ValueError(f"{type(task).__name__}: sample tags {s.tags} are not one of its cells()")
        cells[row] = index[key]
    lengths = torch.tensor([len(s.tokens) for s in samples])
    loss_mask = torch.arange(width - 1)[None, :] < (lengths[:, None] - 1)
    return {"tokens": tokens, "loss_mask": loss_mask, "answer_mask": answers, "cell": cells}


class TaskTrainBatches(MicroBatchStream):
    """A task's train micro-batches; `stream` as `TrainBatches`'s (start, stop, ranks: `MicroBatchStream`)."""

    def __init__(self, task: Task, **stream: Any):
        super().__init__(**stream)
        self.task, self.width = task, self.seq_len + 1

    def batch(self, i: int) -> dict[str, torch.Tensor]:
        b = self.micro_batch_size
        return collate(
            self.task, [self.task.train_sample(self.seed, i * b + j) for j in range(b)], self.width
        )


class TaskValBatches(Dataset):
    """The held-out micro-batches: item j holds held-out samples j*B .. j*B + B - 1."""

    def __init__(self, task: Task, *, seq_len: int, micro_batch_size: int, n_batches: int):
        self.task, self.width, self.micro_batch_size, self.n_batches = (
            task,
            seq_len + 1,
            micro_batch_size,
            n_batches,
        )

    def __len__(self) -> int:
        return self.n_batches

    def __getitem__(self, j: int) -> dict[str, torch.Tensor]:
        if not 0 <= j < self.n_batches:
            raise IndexError(j)
        b = self.micro_batch_size
        return collate(self.task, [self.task.held_out_sample(j * b + i) for i in range(b)], self.width)
