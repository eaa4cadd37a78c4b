"""What one run reads: its data (a corpus's token arrays, or a task that generates samples) and the
loaders over it, cut for this process's rank.

The stream of micro-batches depends on (seed, index) only (each pass a permutation of disjoint windows, or
windows at random offsets: `data.sampling`, ablate.data.loader), so a resumed run starts where it stopped:
the training loader starts at the micro-batch of its resume step, which its checkpoint carries. With `world` ranks, rank r takes
micro-batches r, r + world, ...: optimizer step s sees micro-batches s*A*world .. (s+1)*A*world - 1 over
all ranks (A = accumulate per rank), the same global batch as one process accumulating A*world
micro-batches. The held-out batches are fixed; each rank validates its share.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, Subset

from ablate.core.errors import UserError
from ablate.core.workspace import Workspace
from ablate.recipe.resolve import RunSpec


def load_data(run: RunSpec, workspace: Workspace) -> Any:
    """The run's data: token arrays of a corpus, or a task (ablate.data.tasks) that generates samples."""
    from ablate.data import load_tokens
    from ablate.data.task_batches import build_task, check_fits, task_spec

    if task_spec(run.data) is None:
        tokens = load_tokens(run.data, workspace)
        if tokens.vocab_size > run.model.vocab_size:
            raise UserError(
                f"model.vocab_size: {run.model.vocab_size} is smaller than the data's vocabulary "
                f"({tokens.vocab_size}, tokenizer {tokens.tokenizer}); set model.vocab_size >= {tokens.vocab_size}"
            )
        return tokens
    task = build_task(run.data)
    check_fits(task, seq_len=run.train.seq_len, vocab_size=run.model.vocab_size)
    return task


def loaders(
    run: RunSpec, data: Any, *, start_step: int, rank: int, world: int
) -> tuple[DataLoader, DataLoader]:
    """(training, validation) loaders of `data` for rank `rank` of `world`, training from `start_step`."""
    from ablate.data import TrainBatches, ValBatches
    from ablate.data.task_batches import TaskTrainBatches, TaskValBatches
    from ablate.data.tasks import Task

    cfg = run.train
    batches = dict(
        seq_len=cfg.seq_len,
        micro_batch_size=cfg.micro_batch_size,
        seed=run.seed,
        start=start_step * cfg.accumulate * world,
        rank=rank,
        world_size=world,
    )
    val_batches = dict(seq_len=cfg.seq_len, micro_batch_size=cfg.micro_batch_size, n_batches=cfg.val_batches)
    if isinstance(data, Task):
        train = DataLoader(TaskTrainBatches(data, **batches), batch_size=None)
        held_out = TaskValBatches(data, **val_batches)
    else:
        train = DataLoader(TrainBatches(data.train, sampling=run.data.sampling, **batches), batch_size=None)
        held_out = ValBatches(data.val, **val_batches)
    val = DataLoader(
        Subset(held_out, range(rank, len(held_out), world)) if world > 1 else held_out, batch_size=None
    )
    return train, val
