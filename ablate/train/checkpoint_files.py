"""A run's checkpoints as files: one `*.ckpt` file (one device, DDP), or under `train.strategy: fsdp` a
`*.ckpt` folder that torch.distributed.checkpoint writes, one shard file per rank beside its `.metadata`
and Lightning's `meta.pt` (the step, the loops, the callbacks).

Written whole or not at all: a file is written to `NAME.partial` and renamed over `NAME`; a folder cannot
be renamed over a folder, so the new one is written to `NAME.partial`, the old one renamed `NAME.previous`,
the new one renamed `NAME`, and the old one deleted (`swap_in`). A kill between the two renames leaves no
`NAME` but a whole `NAME.previous`, which `candidates` offers next. Lightning's ModelParallelStrategy
writes into the folder it is given, so `AtomicShardedStrategy` gives it `NAME.partial`.

One reader for everything that reads a checkpoint outside training (`ablate eval`'s probes, budget
extension, resume): `meta` (the step) and `model_weights` (the whole model's weights, a sharded folder
gathered with torch.distributed.checkpoint in this one process).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy

PARTIAL, PREVIOUS = ".partial", ".previous"
META = "meta.pt"  # Lightning's name for the loops' state beside the shards (lightning.fabric.utilities.load)


def sharded(path: Path) -> bool:
    return path.is_dir()


def candidates(path: Path) -> list[Path]:
    """Where the checkpoint `path` may be: itself, or the whole previous one a kill left mid-swap."""
    return [p for p in (path, path.with_name(path.name + PREVIOUS)) if p.exists()]


def swap_in(partial: Path, path: Path) -> None:
    """`partial`, written whole, becomes `path` (module docstring); on global rank 0 only."""
    if not sharded(path):
        os.replace(partial, path)  # atomic for a file or where nothing is
        return
    previous = path.with_name(path.name + PREVIOUS)
    shutil.rmtree(previous, ignore_errors=True)
    path.rename(previous)
    partial.rename(path)
    shutil.rmtree(previous)


def save(trainer: Any, path: Path) -> None:
    """The trainer's whole state at `path`, written whole or not at all, whatever the strategy."""
    if isinstance(trainer.strategy, AtomicShardedStrategy):
        trainer.save_checkpoint(path, weights_only=False)  # the strategy swaps it in itself
        return
    partial = path.with_name(path.name + PARTIAL)
    trainer.save_checkpoint(partial, weights_only=False)  # global rank 0 writes the file
    if trainer.is_global_zero:
        swap_in(partial, path)


def remove(path: Path) -> None:
    """A checkpoint file or folder, gone."""
    if sharded(path):
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def copy(source: Path, target: Path) -> None:
    """`source` copied to `target`, whole or not at all."""
    partial = target.with_name(target.name + PARTIAL)
    if partial.exists():
        remove(partial)
    if sharded(source):
        shutil.copytree(source, partial)
    else:
        shutil.copyfile(source, partial)
    swap_in(partial, target)


def size(path: Path) -> int:
    """Bytes on disk of a checkpoint file or folder."""
    if not sharded(path):
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def meta(path: Path) -> dict[str, Any]:
    """The checkpoint's loops' state (`global_step`, the callbacks'): the file, or a folder's meta.pt. A
    folder without its `.metadata` (dcp writes it last, once every shard is written) is refused."""
    if not sharded(path):
        return torch.load(path, map_location="cpu", weights_only=True)
    if not (path / ".metadata").is_file() or not (path / META).is_file():
        raise FileNotFoundError(f"{path} is not a whole sharded checkpoint (no .metadata or {META})")
    return torch.load(path / META, map_location="cpu", weights_only=True)


def step(path: Path) -> int:
    return int(meta(path)["global_step"])


def model_weights(path: Path) -> dict[str, torch.Tensor]:
    """The model's whole weights (the DecoderLM's names) from a checkpoint file or a sharded folder (its
    shards gathered in this process, as torch.distributed.checkpoint.format_utils.dcp_to_torch_save
    gathers them, without writing the file)."""
    if sharded(path):
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

        everything: dict[str, Any] = {}
        _load_state_dict(
            everything,
            storage_reader=FileSystemReader(path),
            planner=_EmptyStateDictLoadPlanner(),
            no_dist=True,
        )
        state = everything["state_dict"]
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    return {k[len("model.") :]: v for k, v in state.items() if k.startswith("model.")}


class AtomicShardedStrategy(ModelParallelStrategy):
    """Lightning's ModelParallelStrategy (FSDP2; each rank writes its own shard) whose checkpoints are
    written to `NAME.partial` and swapped in whole (module docstring)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        path = Path(self.broadcast(str(filepath)))
        partial = path.with_name(path.name + PARTIAL)
        if self.is_global_zero and partial.exists():
            remove(partial)  # a save a kill interrupted
        self.barrier()
        super().save_checkpoint(checkpoint, partial, storage_options)
        self.barrier()  # every shard and the metadata are written
        if self.is_global_zero:
            swap_in(partial, path)
        self.barrier()
