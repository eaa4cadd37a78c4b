"""One RunSpec -> one Lightning training run, tracked in MLflow: the steps in order.

`train_run` takes the run folder's lock (`resume_lock`) and decides once what the run trains on
(`choices.decided`: device, precision, and on CUDA the attention and compiling measured; the sections as
they train); global rank 0 opens the run's MLflow record (`records`), or finds it finished; `_train`
builds the model and its LightningModule (`module`), picks the checkpoint to resume (`resume`), the
loaders (`loaders`) and the Trainer (`trainer`), and fits. Another rank of a multi-device run
(`train_rank`) trains the same way and records nothing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, TypedDict, Unpack

import lightning.pytorch as L
import torch

from ablate.core.workspace import Workspace
from ablate.hardware.allocator import tune_glibc_malloc
from ablate.model.decoder import build_model
from ablate.recipe.resolve import RunSpec
from ablate.store import tracking
from ablate.store.stores import Stores
from ablate.train import launch, records, sharding, trainer
from ablate.train.choices.decided import Decided, decide
from ablate.train.loaders import load_data, loaders
from ablate.train.module import Diverged, LMModule, compile_seconds
from ablate.train.records import Sink, TrainResult
from ablate.train.resume import resume_point, run_dir


class TrainOptions(TypedDict, total=False):
    """How one run is trained and recorded, beside the run itself (`train_run`, and `train_budgets`
    for each run it trains)."""

    parent_run_id: str | None  # the sweep's MLflow parent run
    progress: bool  # the progress line (default True)
    extra_tags: dict[str, str] | None  # MLflow tags beside the recipe's
    callbacks: list[L.Callback] | None  # Lightning callbacks beside the run's own
    folder_wait: float  # seconds to wait for another process training the run folder (default 0)


def train_run(run: RunSpec, stores: Stores, **options: Unpack[TrainOptions]) -> TrainResult:
    """Train `run` (or resume it from its last checkpoint); returns the final validation metrics.

    One process at a time trains a run folder (ablate.train.resume_lock): while another holds it, this one
    waits up to `folder_wait` seconds, then stops in one line. Raises `Diverged` after marking the MLflow run
    FAILED with the reason.
    """
    from ablate.train import resume_lock

    if launch.global_rank(run.train) != 0:  # the other ranks train with rank 0, which holds the folder
        return train_rank(run, workspace=stores.workspace, callbacks=options.get("callbacks"))
    stores.mlflow_uri()  # a damaged or foreign tracking store is one line before anything is written
    with resume_lock.training(run_dir(stores.workspace, run), wait=options.get("folder_wait", 0.0)):
        return _train_run(run, stores, options)


def _train_run(run: RunSpec, stores: Stores, options: TrainOptions) -> TrainResult:
    """Global rank 0: the run's MLflow record around its training, and its result."""
    folder = run_dir(stores.workspace, run)
    client = stores.client()
    decided = decide(run, stores.workspace)
    print(f"precision: {decided.where.precision} ({decided.where.reason})", flush=True)
    tags = {**records.run_tags(run, decided), **(options.get("extra_tags") or {})}
    state, run_id = tracking.open_run(
        client, run, stores.workspace, parent_run_id=options.get("parent_run_id"), extra_tags=tags
    )
    done = records.already_finished(client, run_id, state, folder)
    if done is not None:
        return done
    # Killed or crashed (anything but Diverged): the run stays RUNNING, so the next attempt resumes it
    # (one MLflow run per RunSpec).
    try:
        data = load_data(run, stores.workspace)
        records.record_data(client, run_id, run, data)
        sink = records.metric_sink(client, run_id)
        callbacks = list(options.get("callbacks") or [])
        result = _train(
            run, data, folder, stores.workspace, decided, sink, options.get("progress", True), callbacks
        )
        records.log_final_metrics(sink, result, compiled=decided.train.compile)
    except Diverged as e:
        records.mark_failed(client, run_id, str(e))
        raise
    result.run_id = run_id
    records.write_result(folder, result)
    records.finish_in_mlflow(client, run_id, result)
    return result


def train_rank(
    run: RunSpec, *, workspace: Workspace, callbacks: list[L.Callback] | None = None
) -> TrainResult:
    """A rank other than global rank 0 of a multi-device run: the same training, no MLflow, no result
    files; `callbacks`: those that every rank runs (the branch points' checkpoints, a collective)."""
    data = load_data(run, workspace)
    decided = decide(run, workspace)  # rank 0's attention choice where it measured first (the cache)
    return _train(run, data, run_dir(workspace, run), workspace, decided, None, False, list(callbacks or []))


def _train(
    run: RunSpec,
    data: Any,
    folder: Path,
    workspace: Workspace,
    decided: Decided,
    sink: Sink | None,
    progress: bool,
    callbacks: list[L.Callback],
) -> TrainResult:
    """Train on this process's rank what `decided` says (the model built with its `model:` section,
    compiled, placed and scheduled by its `train:`); `sink` (global rank 0 only) receives the metrics."""
    from ablate.data.tasks import Task
    from ablate.train.training_clock import TrainingClock

    cfg = decided.train
    trainer.quiet_lightning()
    tune_glibc_malloc()  # ~8-10% faster steps: activations are not unmapped and faulted in every step
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    task = data if isinstance(data, Task) else None
    model = build_model(decided.model, seed=run.seed)
    module = LMModule(
        model, cfg, sink, task=task, loss_on=run.data.task_loss, precision=decided.where.precision
    )
    world, rank = launch.world_size(cfg), launch.global_rank(cfg)
    start_step, resume = resume_point(folder / "checkpoints", rank)  # a file, or fsdp's sharded folder
    clock = TrainingClock(run.key)  # the earlier attempts' seconds, from the checkpoint resumed from
    train, val = loaders(run, data, start_step=start_step, rank=rank, world=world)
    started, compiled_before = time.perf_counter(), compile_seconds()
    with launch.local_ranks(run, workspace, folder) as plugins:
        fitter = trainer.assemble(
            cfg, decided.where, folder, callbacks=[clock, *callbacks], plugins=plugins, progress=progress
        )
        trainer.fit(fitter, module, train, val, resume, folder)
    seconds, compiling = time.perf_counter() - started, compile_seconds() - compiled_before
    # Table 3: attention to answer and noise, on held-out samples; global rank 0 records it, and under fsdp
    # every rank computes it with rank 0 (each forward all-gathers the blocks' shards, a collective)
    if task is not None and (sink is not None or sharding.sharded(cfg)):
        from ablate.analysis import task_attention_metrics

        shares = task_attention_metrics(model, task, device=module.device)
        if sink is not None:
            module.history[-1].update(shares)
            sink(shares, fitter.global_step)
    return records.finished_result(
        run,
        module.history,
        steps=fitter.global_step,
        trained_steps=fitter.global_step - start_step,
        seconds=seconds,
        compiling=compiling,
        earlier_seconds=clock.earlier_seconds,
    )
