"""One RunSpec -> one Lightning training run, tracked in MLflow.

Optimiser (Appendix E): AdamW with the recipe's betas, eps and weight decay. Weight decay applies to the
matrices (embedding, projections, LM head: every parameter with 2 or more dimensions); it does not apply
to vectors: norm weights and diff attention's λ vectors (decaying λ would pull it towards λ_init's
re-parameterised zero point, which the paper does not ask for). Under `model.parametrization: mup` each
parameter's lr, decay and eps follow its μP rule instead (ablate.model.parametrization.param_groups).
Schedule (`train.schedule`): linear warmup from 0 over `warmup_steps`, then either linear decay to `min_lr`
at `steps` (`linear`, Appendix E) or warmup-stable-decay (`wsd`, Hägele et al. 2024, arXiv 2405.18392):
constant until `cooldown_start`, then down to `min_lr` over the last `cooldown_fraction` of the steps,
linearly or as 1 - sqrt(t). Before its cooldown a wsd run's lr does not depend on `steps`, which is what
lets one long run branch into every shorter budget (ablate.train.branches).
One optimiser step sees `batch_tokens` tokens (gradient accumulation over micro-batches).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
import torch.nn.functional as F

from ablate.core import contract
from ablate.core.config import TrainConfig
from ablate.core.errors import UserError
from ablate.core.workspace import Workspace
from ablate.hardware.allocator import tune_glibc_malloc
from ablate.hardware.machine import machine_description
from ablate.hardware.precision import choose_precision, training_device
from ablate.model.decoder import DecoderLM, attention_kernel, build_model
from ablate.model.parametrization import param_groups
from ablate.recipe.resolve import RunSpec
from ablate.store import tracking
from ablate.store.stores import Stores
from ablate.train.metrics import SUM_KEYS, ar_hit_mask, sliced_loss_sums, task_summary, task_sums


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


def compile_seconds() -> float:
    """Seconds this process has spent in torch.compile so far (forward and backward graphs, recompiles
    included), from dynamo's own accounting (a private API: 0 where a torch version lacks it); 0 before
    anything compiled."""
    try:
        from torch._dynamo.utils import calculate_time_spent
    except ImportError:
        return 0.0
    return float(calculate_time_spent().get("total_wall_time", 0.0))


class Diverged(RuntimeError):
    """The training loss became NaN or infinite."""


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of `lr` for optimizer step `step` (0-based): linear warmup, then the decay of
    `cfg.schedule` (module docstring)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    floor = cfg.min_lr / cfg.lr
    if cfg.schedule == "wsd":
        if step < cfg.cooldown_start:
            return 1.0
        t = min(1.0, (step - cfg.cooldown_start) / cfg.cooldown_steps)  # 0 at the cooldown's first step
        return floor + (1.0 - floor) * (1.0 - (math.sqrt(t) if cfg.cooldown_shape == "sqrt" else t))
    remaining = max(0.0, (cfg.steps - step) / max(1, cfg.steps - cfg.warmup_steps))
    return floor + (1.0 - floor) * remaining


class LMModule(L.LightningModule):
    """Next-token cross-entropy on packed sequences; logs through `sink(metrics, step)`.

    With a `task` (ablate.data.tasks) the batches are dicts (ablate.data.task_batches): training takes the loss on
    the answer tokens (`loss_on='answers'`) or on every non-padding token ('all'); validation logs exact-match
    accuracy overall, per tag and per cell, and the loss on answers, which is also `val/loss` (the number
    checkpoints and sweeps select on).
    """

    def __init__(
        self,
        model: DecoderLM,
        cfg: TrainConfig,
        sink: Callable[[dict[str, float], int], None] | None,
        task: Any = None,
        loss_on: str = "answers",
    ):
        super().__init__()
        self.task, self.loss_on = task, loss_on
        self.model = model
        self.cfg = cfg
        self.sink = sink
        self.history: list[dict[str, float]] = []  # validation results, in order
        self._step_losses: list[torch.Tensor] = []
        self._grad_norm = float("nan")
        self._clock = (time.perf_counter(), 0)
        self._val: dict[str, torch.Tensor] = {}
        self.compiled = torch.compile(model) if cfg.compile else model
        self._compile_clock = (compile_seconds(), compile_seconds())  # (at start, at the last log)

    # --- training -------------------------------------------------------------------------------
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.compiled(tokens)

    def training_step(self, batch: torch.Tensor | dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if isinstance(batch, dict):  # a task: the loss on the answers (or on all tokens), never on padding
            logits = self(batch["tokens"][:, :-1])
            per_token = F.cross_entropy(
                logits.float().flatten(0, 1), batch["tokens"][:, 1:].flatten(), reduction="none"
            )
            mask = batch["answer_mask" if self.loss_on == "answers" else "loss_mask"].flatten().float()
            loss = (per_token * mask).sum() / mask.sum().clamp(min=1)
        else:
            logits = self(batch[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        # On several ranks only the gradient check below raises: it sees all-reduced gradients, so every
        # rank stops at the same step instead of one waiting for the others in a collective.
        if self.trainer.world_size == 1 and not torch.isfinite(loss):
            raise Diverged(f"training loss is {loss.item()} at step {self.global_step + 1}")
        self._step_losses.append(loss.detach())
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        self._grad_norm = (
            float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))) if grads else 0.0
        )
        if not math.isfinite(self._grad_norm):
            raise Diverged(f"gradient norm is {self._grad_norm} at step {self.global_step + 1}")

    def on_train_batch_end(self, outputs: Any, batch: torch.Tensor, batch_idx: int) -> None:
        if (batch_idx + 1) % self.trainer.accumulate_grad_batches:
            return  # mid-accumulation: no optimizer step yet
        step = self.global_step
        losses, self._step_losses = self._step_losses, []
        if step % self.cfg.log_every and step not in (1, self.cfg.steps):
            return  # step 1 is always logged: its loss is the initial loss (no update has happened yet)
        loss = torch.stack(losses).mean() if losses else torch.tensor(float("nan"), device=self.device)
        loss = float(
            self.trainer.strategy.reduce(loss, reduce_op="mean")
        )  # all ranks: the global batch's loss
        if self.sink is None:
            return  # not global rank 0
        now, last_step = time.perf_counter(), self._clock[1]
        compiled = compile_seconds()  # compile time is reported apart, not counted as training time
        seconds = now - self._clock[0] - (compiled - self._compile_clock[1])
        self._clock, self._compile_clock = (now, step), (self._compile_clock[0], compiled)
        metrics = {
            "train/loss": loss,
            "lr": self.trainer.optimizers[0].param_groups[0]["lr"],
            "grad_norm": self._grad_norm,
            "tokens": step * self.cfg.batch_tokens,
            "tokens_per_s": (step - last_step) * self.cfg.batch_tokens / seconds
            if seconds > 0
            else float("nan"),
        }
        if self.cfg.compile:
            metrics["compile_s"] = compiled - self._compile_clock[0]
        self.sink(metrics, step)

    def configure_optimizers(self):
        # Standard: decay on 2+-dimensional parameters only; mup: per-group lrs (ablate.model.parametrization).
        groups = param_groups(
            self.model, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay, eps=self.cfg.eps
        )
        optimizer = torch.optim.AdamW(
            groups,
            lr=self.cfg.lr,
            betas=tuple(self.cfg.betas),
            eps=self.cfg.eps,
        )
        cfg = self.cfg
        # A plain function, not a callable object: LambdaLR then keeps it out of the checkpoint, which
        # stays loadable with weights_only=True; the schedule is rebuilt from the recipe on resume.
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    # --- validation -----------------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        self._val = {key: torch.zeros((), dtype=torch.float64, device=self.device) for key in SUM_KEYS}
        if self.task is not None:
            self._val = {
                "task": torch.zeros((len(self.task.cells()), 4), dtype=torch.float64, device=self.device)
            }

    def validation_step(self, batch: torch.Tensor | dict[str, torch.Tensor], batch_idx: int) -> None:
        if isinstance(batch, dict):
            logits = self(batch["tokens"][:, :-1]).float()
            per_token = F.cross_entropy(
                logits.flatten(0, 1), batch["tokens"][:, 1:].flatten(), reduction="none"
            )
            self._val["task"] += task_sums(
                per_token.view(logits.shape[:2]), logits.argmax(-1), batch, len(self.task.cells())
            )
            return
        logits = self(batch[:, :-1])
        per_token = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction="none")
        sums = sliced_loss_sums(per_token.view(batch.shape[0], -1), ar_hit_mask(batch))
        for key, value in sums.items():
            self._val[key] = self._val[key] + value

    def _lm_val_metrics(self) -> dict[str, float]:
        # Each rank validated its share of the held-out batches: sum the sums over ranks (one collective).
        summed = self.trainer.strategy.reduce(torch.stack([self._val[k] for k in SUM_KEYS]), reduce_op="sum")
        v = dict(zip(SUM_KEYS, summed.tolist()))
        total = v["total_count"]
        return {
            "val/loss": v["total_sum"] / total,
            "val/ar_hit": v["ar_hit_sum"] / v["ar_hit_count"] if v["ar_hit_count"] else float("nan"),
            "val/others": v["others_sum"] / v["others_count"] if v["others_count"] else float("nan"),
            "val/ar_hit_share": v["ar_hit_count"] / total,
            "tokens": self.global_step * self.cfg.batch_tokens,
        }

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking or not self._val:
            return
        if self.task is not None:
            summed = self.trainer.strategy.reduce(self._val["task"], reduce_op="sum")
            metrics = task_summary(summed, self.task.cells())
            metrics.update(
                {"val/loss": metrics["val/answer_loss"], "tokens": self.global_step * self.cfg.batch_tokens}
            )
        else:
            metrics = self._lm_val_metrics()
        for i, block in enumerate(self.model.blocks):
            if (lam := contract.lambda_value(block.attention)) is not None:  # ablate.core.contract
                metrics[f"lambda/layer_{i:02d}"] = lam
        if not math.isfinite(metrics["val/loss"]):
            raise Diverged(f"validation loss is {metrics['val/loss']} at step {self.global_step}")
        self.log("val/loss", metrics["val/loss"], logger=False)  # for checkpoint selection
        self.history.append({"step": self.global_step, **metrics})
        if self.sink is not None:
            self.sink(metrics, self.global_step)


@dataclass
class TrainResult:
    run_id: str
    status: str  # finished | failed | already-finished
    name: str
    val_loss: float = float("nan")
    ar_hit: float = float("nan")
    others: float = float("nan")
    ar_hit_share: float = float("nan")
    mean_tokens_per_s: float = float(
        "nan"
    )  # the whole run's (compiling left out); MLflow's tokens_per_s is per log line
    accuracy: float = float("nan")  # tasks: exact match on the held-out samples
    steps: int = 0
    seconds: float = 0.0
    compile_seconds: float = 0.0  # of `seconds`, spent in torch.compile (`train.compile`)
    # `seconds` is this attempt's; a resumed run's earlier attempts, up to its checkpoint, spent this more
    earlier_attempts_seconds: float = 0.0  # (ablate.train.training_clock)
    reason: str = ""
    history: list[dict[str, float]] = field(default_factory=list)

    def summary(self) -> str:
        if self.status == "failed":
            return f"{self.name}: FAILED ({self.reason}); MLflow run {self.run_id}"
        if math.isfinite(self.accuracy):
            return (
                f"{self.name}: accuracy {self.accuracy:.3f}  answer loss {self.val_loss:.4f}  "
                f"{self.mean_tokens_per_s:,.0f} tokens/s on average  {self.steps} steps in {self.seconds:.0f} s; MLflow run {self.run_id}"
                + ("  [already finished]" if self.status == "already-finished" else "")
            )
        return (
            f"{self.name}: val loss {self.val_loss:.4f}  AR-Hit {self.ar_hit:.4f}  Others {self.others:.4f}  "
            f"(AR-Hit share {self.ar_hit_share:.1%})  {self.mean_tokens_per_s:,.0f} tokens/s on average  "
            f"{self.steps} steps in {self.seconds:.0f} s{self._compiled()}; MLflow run {self.run_id}"
            + ("  [already finished]" if self.status == "already-finished" else "")
        )

    def _compiled(self) -> str:
        return f" ({self.compile_seconds:.0f} s of it compiling)" if self.compile_seconds > 0 else ""


def shape_tags(run: RunSpec) -> dict[str, str]:
    """What the report's #heads / d / GN columns and the fits' parameter counts read from MLflow."""
    from ablate.model.cost import attention_shape, model_cost

    shape = attention_shape(run.model)
    budget = model_cost(run.model, run.train.seq_len)
    return {
        "ablate.heads": str(shape["heads"]),
        "ablate.head_width": str(shape["d"]),
        "ablate.gn": shape["gn"],
        "ablate.lambda_init": shape["lambda_init"],
        "ablate.params": str(budget.params),
        "ablate.non_embedding_params": str(budget.non_embedding_params),
        "ablate.fwd_flops_per_token": str(budget.fwd_flops_per_token),
        "ablate.tokens": str(run.train.tokens),
    }


def run_attention_kernel(run: RunSpec, device: str, precision: str) -> str:
    """The attention core the run's layers use on `device` under `precision` (what `auto` resolves to,
    which depends on the CPU kind as well as the dtype), so a rerun elsewhere is explainable from MLflow."""
    from ablate.hardware.precision import compute_dtype

    model = build_model(run.model, device="meta")
    return attention_kernel(model, torch.device(device), compute_dtype(precision), seq_len=run.train.seq_len)


def run_dir(workspace: Workspace, run: RunSpec) -> Path:
    """The run's folder in the workspace: checkpoints, result.json, its lock."""
    return workspace.run_folder(tracking.experiment_name(run.recipe, run.scale), f"{run.name}-{run.key}")


def train_run(
    run: RunSpec,
    stores: Stores,
    *,
    parent_run_id: str | None = None,
    progress: bool = True,
    extra_tags: dict[str, str] | None = None,
    callbacks: list[L.Callback] | None = None,
    folder_wait: float = 0.0,
) -> TrainResult:
    """Train `run` (or resume it from its last checkpoint); returns the final validation metrics.

    One process at a time trains a run folder (ablate.train.folder_lock): while another holds it, this one
    waits up to `folder_wait` seconds, then stops in one line. Raises `Diverged` after marking the MLflow run
    FAILED with the reason.
    """
    from ablate.train import folder_lock, launch

    if launch.global_rank(run.train) != 0:  # the other ranks train with rank 0, which holds the folder
        return train_rank(run, workspace=stores.workspace)
    stores.mlflow_uri()  # a damaged or foreign tracking store is one line before anything is written
    with folder_lock.training(run_dir(stores.workspace, run), wait=folder_wait):
        return _train_run(
            run,
            stores,
            parent_run_id=parent_run_id,
            progress=progress,
            extra_tags=extra_tags,
            callbacks=callbacks,
        )


def _train_run(
    run: RunSpec,
    stores: Stores,
    *,
    parent_run_id: str | None,
    progress: bool,
    extra_tags: dict[str, str] | None,
    callbacks: list[L.Callback] | None,
) -> TrainResult:
    from ablate.train import launch

    cfg = run.train
    workspace = stores.workspace
    folder = run_dir(workspace, run)
    if (
        launch.global_rank(cfg) != 0
    ):  # another node's rank 0 (or a torchrun/srun rank): trains, records nothing
        return train_rank(run, workspace=workspace)
    client = stores.client()
    precision, why = choose_precision(cfg.precision, training_device(cfg.accelerator), key="train.precision")
    print(f"precision: {precision} ({why})", flush=True)
    state, run_id = tracking.open_run(
        client,
        run,
        workspace,
        parent_run_id=parent_run_id,
        extra_tags={
            **shape_tags(run),
            "ablate.precision": precision,
            "ablate.precision_reason": why,
            "ablate.attention_kernel": run_attention_kernel(run, training_device(cfg.accelerator), precision),
            "ablate.machine": machine_description(training_device(cfg.accelerator)),
            **(extra_tags or {}),
        },
    )
    result_file = folder / "result.json"
    saved = _saved_result(result_file)
    if saved is not None:  # written (atomically) when training ended: a kill after it loses nothing
        if "tokens_per_s" in saved:  # written before the field said it is the run's mean
            saved["mean_tokens_per_s"] = saved.pop("tokens_per_s")
        done = TrainResult(**{**saved, "status": "already-finished", "run_id": run_id})
        if state != "finished":  # killed between the result and the MLflow bookkeeping: finish that
            _finish_in_mlflow(client, run_id, done)
        return done
    try:
        tokens = _load_data(run, workspace)
        if tokens.vocab_size > run.model.vocab_size:
            raise UserError(
                f"model.vocab_size: {run.model.vocab_size} is smaller than the data's vocabulary "
                f"({tokens.vocab_size}, tokenizer {tokens.tokenizer}); set model.vocab_size >= {tokens.vocab_size}"
            )
        client.log_batch(run_id, params=[])  # fail fast if the store went away
        tracking.log_text(client, run_id, json.dumps(tokens.describe(), indent=2), "data.json")
        _record_passes(client, run_id, run, tokens)

        def sink(metrics: dict[str, float], step: int) -> None:
            tracking.log_metrics(client, run_id, metrics, step)

        result = _train(run, cfg, tokens, folder, sink, progress, callbacks or [], workspace)
        sink({"mean_tokens_per_s": result.mean_tokens_per_s}, result.steps)
        if cfg.compile:  # the whole run's, validation's compiling included
            sink({"compile_s": result.compile_seconds}, result.steps)
    except Diverged as e:
        client.set_tag(run_id, tracking.TAG + "failure_reason", str(e))
        client.set_terminated(run_id, status="FAILED")
        raise
    except BaseException:
        # Killed or crashed: the run stays RUNNING, so the next attempt resumes it (one MLflow run per RunSpec).
        raise
    result.run_id = run_id
    folder.mkdir(parents=True, exist_ok=True)
    partial = result_file.with_name("result.json.partial")
    partial.write_text(json.dumps({k: v for k, v in asdict(result).items() if k not in ("status", "run_id")}))
    partial.replace(result_file)
    _finish_in_mlflow(client, run_id, result)
    return result


def _finish_in_mlflow(client: Any, run_id: str, result: TrainResult) -> None:
    summary = {**{k: v for k, v in asdict(result).items() if k != "history"}, "status": "finished"}
    tracking.log_json(client, run_id, summary, "final_metrics.json")
    client.set_terminated(run_id, status="FINISHED")


def train_rank(run: RunSpec, *, workspace: Workspace) -> TrainResult:
    """A rank other than global rank 0 of a multi-device run: the same training, no MLflow, no files."""
    tokens = _load_data(run, workspace)
    return _train(run, run.train, tokens, run_dir(workspace, run), None, False, [], workspace)


def _record_passes(client: Any, run_id: str, run: RunSpec, data: Any) -> None:
    """Tag the run with its training split's tokens and its passes over them (ablate.data.passes), and
    say so when it reads its text more than once. A task generates fresh samples: nothing to count."""
    from ablate.core.tables import si
    from ablate.data import passes

    if not hasattr(data, "train"):
        return
    split = int(len(data.train))
    p = passes.passes(run.train.tokens, split)
    client.set_tag(run_id, passes.SPLIT_TAG, str(split))
    client.set_tag(run_id, passes.PASSES_TAG, f"{p:.4f}")
    if passes.repeats(p):
        print(
            f"{passes.REPEATS} {run.name}: {si(run.train.tokens)} tokens are {p:.2f} passes over the "
            f"{si(split)} training tokens of {run.data.source}: it reads text again",
            flush=True,
        )


def _load_data(run: RunSpec, workspace: Workspace) -> Any:
    """The run's data: token arrays of a corpus, or a task (ablate.data.tasks) that generates samples."""
    from ablate.data import load_tokens
    from ablate.data.task_batches import build_task, check_fits, task_spec

    if task_spec(run.data) is None:
        return load_tokens(run.data, workspace)
    task = build_task(run.data)
    check_fits(task, seq_len=run.train.seq_len, vocab_size=run.model.vocab_size)
    return task


def _train(
    run: RunSpec,
    cfg: TrainConfig,
    tokens: Any,
    folder: Path,
    sink: Callable[[dict[str, float], int], None] | None,
    progress: bool,
    callbacks: list[L.Callback],
    workspace: Workspace,
) -> TrainResult:
    """Train on this process's rank; `sink` (global rank 0 only) receives the metrics."""
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, Subset

    from ablate.data import TrainBatches, ValBatches
    from ablate.data.task_batches import TaskTrainBatches, TaskValBatches
    from ablate.data.tasks import Task
    from ablate.train import launch
    from ablate.train.layer_stats import LayerStats
    from ablate.train.progress import StepProgress
    from ablate.train.training_clock import TrainingClock

    quiet_lightning()
    tune_glibc_malloc()  # ~8-10% faster steps: activations are not unmapped and faulted in every step
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    task = tokens if isinstance(tokens, Task) else None
    model = build_model(run.model, seed=run.seed)
    module = LMModule(model, cfg, sink, task=task, loss_on=run.data.task_loss)
    world, rank = launch.world_size(cfg), launch.global_rank(cfg)
    last = folder / "checkpoints" / "last.ckpt"
    checkpoint = ModelCheckpoint(
        dirpath=folder / "checkpoints",
        filename="best",
        monitor="val/loss",
        mode="min",
        save_top_k=1,
        save_last=True,
        enable_version_counter=False,
    )
    start_step, resume = _resume_point(folder / "checkpoints", rank)
    clock = TrainingClock(run.key)  # the earlier attempts' seconds, from the checkpoint resumed from
    # The stream of micro-batches depends on (seed, index) only; a resumed run starts where it stopped.
    # With `world` ranks, rank r takes micro-batches r, r + world, ...: optimizer step s sees micro-batches
    # s*A*world .. (s+1)*A*world - 1 over all ranks (A = accumulate per rank), the same global batch as
    # one process accumulating A*world micro-batches.
    batches = dict(
        seq_len=cfg.seq_len,
        micro_batch_size=cfg.micro_batch_size,
        seed=run.seed,
        start=start_step * cfg.accumulate * world,
        rank=rank,
        world_size=world,
    )
    val_batches = dict(seq_len=cfg.seq_len, micro_batch_size=cfg.micro_batch_size, n_batches=cfg.val_batches)
    if task is not None:
        train = DataLoader(TaskTrainBatches(task, **batches), batch_size=None)
        held_out = TaskValBatches(task, **val_batches)
    else:
        train = DataLoader(TrainBatches(tokens.train, **batches), batch_size=None)
        held_out = ValBatches(tokens.val, **val_batches)
    val = DataLoader(
        Subset(held_out, range(rank, len(held_out), world)) if world > 1 else held_out, batch_size=None
    )
    precision = choose_precision(cfg.precision, training_device(cfg.accelerator))[
        0
    ]  # `auto` resolved, same rule
    started, compiled_before = time.perf_counter(), compile_seconds()
    with launch.local_ranks(run, workspace, folder) as plugins:
        trainer = L.Trainer(
            accelerator=cfg.accelerator,
            devices=cfg.devices,
            num_nodes=cfg.num_nodes,
            strategy=launch.strategy_for(cfg),
            precision=precision,
            max_steps=cfg.steps,
            accumulate_grad_batches=cfg.accumulate,
            gradient_clip_val=cfg.grad_clip or None,
            val_check_interval=cfg.val_every * cfg.accumulate,
            check_val_every_n_epoch=None,
            num_sanity_val_steps=0,
            logger=False,
            callbacks=[checkpoint, clock, _SameRanks(rank, world), LayerStats(), *callbacks]
            + (
                [StepProgress(cfg.batch_tokens, compile_clock=compile_seconds if cfg.compile else None)]
                if progress and rank == 0
                else []
            ),
            plugins=plugins,
            enable_progress_bar=progress and rank == 0,
            enable_model_summary=False,
            deterministic=cfg.deterministic or None,
            default_root_dir=folder,
            use_distributed_sampler=False,
        )
        try:
            trainer.fit(module, train, val, ckpt_path=resume, weights_only=True)
        except (OSError, RuntimeError) as e:
            _disk_full(e, last)
            raise
        if not module.history or module.history[-1]["step"] != trainer.global_step:
            trainer.validate(module, val, verbose=False)
    seconds = time.perf_counter() - started
    compiling = compile_seconds() - compiled_before
    if task is not None and sink is not None:  # Table 3: attention to answer and noise, on held-out samples
        from ablate.analysis import task_attention_metrics

        shares = task_attention_metrics(model, task, device=module.device)
        module.history[-1].update(shares)
        sink(shares, trainer.global_step)
    final = module.history[-1]
    trained_steps = trainer.global_step - start_step
    return TrainResult(
        run_id="",
        status="finished",
        name=run.name,
        val_loss=final["val/loss"],
        ar_hit=final.get("val/ar_hit", math.nan),
        others=final.get("val/others", math.nan),
        ar_hit_share=final.get("val/ar_hit_share", math.nan),
        accuracy=final.get("val/accuracy", math.nan),
        mean_tokens_per_s=trained_steps * cfg.batch_tokens / (seconds - compiling)
        if seconds > compiling
        else float("nan"),
        steps=trainer.global_step,
        seconds=seconds,
        compile_seconds=compiling,
        earlier_attempts_seconds=clock.earlier_seconds,
        history=module.history,
    )


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


def _saved_result(path: Path) -> dict[str, Any] | None:
    """The finished run's result.json, or None: none yet, or unreadable (a damaged disk, a hand edit), then
    said in a line and kept as `result.json.unreadable`; the run then resumes from its last checkpoint,
    which for a finished run is its last step, and writes the result again."""
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text())
        if not isinstance(saved, dict):
            raise ValueError(f"a {type(saved).__name__}, not an object")
        for key in ("val_loss", "steps"):
            if key not in saved:
                raise ValueError(f"no {key}")
        return saved
    except (ValueError, UnicodeDecodeError) as e:
        print(
            f"[train] {path} cannot be read ({str(e).splitlines()[0][:100]}); kept as result.json.unreadable, "
            "the run resumes from its last checkpoint to write it again",
            flush=True,
        )
        path.replace(path.with_name("result.json.unreadable"))
        return None


def _checkpoint_step(path: Path) -> int:
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    return int(checkpoint["global_step"])


def _resume_point(checkpoints: Path, rank: int = 0) -> tuple[int, Path | None]:
    """(step, checkpoint) to resume from: `last.ckpt`, or where it cannot be read (truncated by a kill or a
    full disk) the run's best checkpoint, or else the run's start, said in a line. The unreadable file is
    kept beside, renamed `*.unreadable`, not deleted."""
    for name in ("last.ckpt", "best.ckpt"):
        path = checkpoints / name
        if not path.exists():
            continue
        try:
            return _checkpoint_step(path), path
        except Exception as e:  # noqa: BLE001 - torch.load raises RuntimeError, EOFError, pickle errors...
            where = (
                "its best checkpoint" if name == "last.ckpt" and (checkpoints / "best.ckpt").exists() else ""
            )
            print(
                f"[train] {path} cannot be read ({type(e).__name__}: {str(e).splitlines()[0][:100]}); "
                f"resuming from {where or 'step 0'} (the file is kept as {name}.unreadable)",
                flush=True,
            )
            if rank == 0:
                path.replace(path.with_name(f"{name}.unreadable"))
    return 0, None


def _disk_full(error: BaseException, checkpoint: Path) -> None:
    """One line, not Lightning's traceback, when the disk filled while a checkpoint was written."""
    import errno
    import shutil

    text = str(error)
    if getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "file write failed" in text:
        free = shutil.disk_usage(checkpoint.parent).free if checkpoint.parent.exists() else 0
        raise UserError(
            f"checkpoint: the disk holding {checkpoint.parent} is full ({free / 2**20:.0f} MiB free) while "
            "a checkpoint was written; free some space and run again: the run resumes from its last whole "
            "checkpoint"
        ) from None
