"""The Trainer of one run, assembled once: on the device and in the precision decided for the run
(ablate.train.choices.decided.Placement), its callbacks (checkpoints, the training clock, layer
statistics, progress, the caller's), and its fit with a full disk said in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as L

from ablate.core.errors import UserError
from ablate.train import launch, sharding
from ablate.train.choices.decided import Placement
from ablate.train.config import TrainConfig


def quiet_lightning() -> None:
    """Keep Lightning's start-up banner (GPU/TPU lines, tips) and known-harmless warnings off the terminal."""
    import logging
    import warnings

    for name in (
        "lightning.pytorch.utilities.rank_zero",
        "lightning.pytorch.accelerators.cuda",
        "lightning.fabric.utilities.rank_zero",
    ):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*is deprecated.*")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*litlogger.*")
    warnings.filterwarnings("ignore", message=".*sync_dist=True.*")  # val/loss is all-reduced by hand, once
    warnings.filterwarnings(
        "ignore", message=".*Checkpoint directory .* exists and is not empty.*"
    )  # resuming
    warnings.filterwarnings(
        "ignore", message=".*noload.*loader strategy is deprecated.*"
    )  # MLflow's SQLAlchemy use
    warnings.filterwarnings(
        "ignore", message=".*dirpath has changed from.*"
    )  # a budget's run resuming from its branch point, saved in the longest run's folder
    # Slurm places ablate's workers itself (ablate.sweep.slurm), one process per run; a run over several
    # nodes is started under srun by the user (docs/scaling-out.md). Lightning's hint to prepend srun,
    # printed once per run wherever Slurm is installed, says nothing to either.
    warnings.filterwarnings("ignore", message=".*`srun` command is available on your system.*")


def assemble(
    cfg: TrainConfig,
    where: Placement,
    folder: Path,
    *,
    callbacks: list[L.Callback],
    plugins: list[Any],
    progress: bool,
) -> L.Trainer:
    """The Trainer: checkpoints (best by val/loss, and last) in `folder`/checkpoints, then `callbacks`; on
    global rank 0 with `progress`, the progress line."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from ablate.train.layer_stats import LayerStats
    from ablate.train.module import compile_seconds
    from ablate.train.progress import StepProgress

    world, rank = launch.world_size(cfg), launch.global_rank(cfg)
    checkpoint = ModelCheckpoint(
        dirpath=folder / "checkpoints",
        filename="best",
        monitor="val/loss",
        mode="min",
        save_top_k=1,
        save_last=True,
        enable_version_counter=False,
    )
    shown = progress and rank == 0
    fsdp = sharding.sharded(cfg)  # FSDP2's policy holds the precision (ablate.train.sharding)
    line = [StepProgress(cfg.batch_tokens, compile_clock=compile_seconds if cfg.compile is True else None)]
    return L.Trainer(
        accelerator=where.device,  # the device the precision and the recorded tags were decided for
        devices=cfg.devices,
        num_nodes=cfg.num_nodes,
        strategy=sharding.lightning_strategy(cfg) if fsdp else launch.strategy_for(cfg),
        precision=sharding.trainer_precision(where.precision) if fsdp else where.precision,
        max_steps=cfg.steps,
        accumulate_grad_batches=cfg.accumulate,
        gradient_clip_val=cfg.grad_clip or None,
        val_check_interval=cfg.val_every * cfg.accumulate,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        logger=False,
        callbacks=[checkpoint, _SameRanks(rank, world), LayerStats(), *callbacks] + (line if shown else []),
        plugins=plugins,
        enable_progress_bar=shown,
        enable_model_summary=False,
        deterministic=cfg.deterministic or None,
        default_root_dir=folder,
        use_distributed_sampler=False,
    )


def fit(trainer: L.Trainer, module: Any, train: Any, val: Any, resume: Path | None, folder: Path) -> None:
    """Train from `resume` (or the start) to the last step, and validate at the last step if no validation
    fell on it."""
    try:
        trainer.fit(module, train, val, ckpt_path=resume, weights_only=True)
    except (OSError, RuntimeError) as e:
        _disk_full(e, folder / "checkpoints" / "last.ckpt")
        raise
    if not module.history or module.history[-1]["step"] != trainer.global_step:
        trainer.validate(module, val, verbose=False)


class _SameRanks(L.Callback):
    """The data shards were cut for (rank, world) before Lightning set up the processes: check it agrees."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world

    def setup(self, trainer: L.Trainer, module: L.LightningModule, stage: str) -> None:
        if (trainer.global_rank, trainer.world_size) != (self.rank, self.world):
            raise RuntimeError(
                f"Lightning placed this process as rank {trainer.global_rank} of {trainer.world_size}, "
                f"the data was split for rank {self.rank} of {self.world}"
            )


def _disk_full(error: BaseException, checkpoint: Path) -> None:
    """One line, not Lightning's traceback, when a checkpoint could not be written: a full disk, or any
    other error of the write (a file size limit, a read-only or vanished folder, an I/O error)."""
    import errno
    import shutil

    text = str(error)
    code = getattr(error, "errno", None)
    if code in (errno.ENOSPC, errno.EDQUOT) or "file write failed" in text:
        free = shutil.disk_usage(checkpoint.parent).free if checkpoint.parent.exists() else 0
        raise UserError(
            f"checkpoint: the disk holding {checkpoint.parent} is full ({free / 2**20:.0f} MiB free) while "
            "a checkpoint was written; free some space and run again: the run resumes from its last whole "
            "checkpoint"
        ) from None
    if isinstance(error, OSError) and code is not None:
        why = {errno.EFBIG: "the file size limit (ulimit -f) is below one checkpoint"}.get(code, "")
        raise UserError(
            f"checkpoint: cannot write a checkpoint into {checkpoint.parent} ({error.strerror or code}"
            f"{'; ' + why if why else ''}); fix that and run again: the run resumes from its last whole "
            "checkpoint"
        ) from None
