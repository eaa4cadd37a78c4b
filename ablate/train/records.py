"""The run's records: its MLflow run (tags, metrics, data, the final metrics, its end), its `result.json`,
and the `TrainResult` that both hold.

`result.json` is written atomically when training ended: a kill after it loses nothing, and a run that
finds it is already finished (its MLflow bookkeeping completed if a kill came in between).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ablate.hardware.machine import machine_description
from ablate.model import kernels
from ablate.model.config import ModelConfig
from ablate.model.decoder import MetaBlocks, attention_kernel, meta_blocks
from ablate.recipe.resolve import RunSpec
from ablate.store import names, tokens_axis, tracking
from ablate.train import sharding
from ablate.train.choices.decided import Decided, Placement

Sink = Callable[[dict[str, float], int], None]  # (metrics, step) -> logged; global rank 0 only


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
    # the `triton` kernels' launch configurations this attempt trained with (ablate.model.kernels.launched)
    triton_launches: dict[str, str] = field(default_factory=dict)
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


def finished_result(
    run: RunSpec,
    history: list[dict[str, float]],
    *,
    steps: int,
    trained_steps: int,
    seconds: float,
    compiling: float,
    earlier_seconds: float,
) -> TrainResult:
    """The result of a run that trained `trained_steps` of its `steps` in `seconds` (`compiling` of them in
    torch.compile), its last validation `history[-1]`."""
    final = history[-1]
    return TrainResult(
        run_id="",
        status="finished",
        name=run.name,
        val_loss=final["val/loss"],
        ar_hit=final.get("val/ar_hit", math.nan),
        others=final.get("val/others", math.nan),
        ar_hit_share=final.get("val/ar_hit_share", math.nan),
        accuracy=final.get("val/accuracy", math.nan),
        mean_tokens_per_s=trained_steps * run.train.batch_tokens / (seconds - compiling)
        if seconds > compiling
        else float("nan"),
        steps=steps,
        seconds=seconds,
        compile_seconds=compiling,
        earlier_attempts_seconds=earlier_seconds,
        triton_launches=kernels.launched(),
        history=history,
    )


def run_tags(run: RunSpec, decided: Decided) -> dict[str, str]:
    """The tags every run carries beside the recipe's: its shape and cost, and where and how it trains, as
    `decided` (the precision, compiling, `auto`'s measured choice: `Decided.tags`; the attention kernel of
    the model that trains), never as the recipe asks (`auto`)."""
    where, parts = decided.where, meta_blocks(decided.model)  # the run's one meta build: shape, cost, kernel
    return {
        **shape_tags(run, parts),
        names.ATTENTION_KERNEL: run_attention_kernel(parts, decided.train.seq_len, where),
        names.MACHINE: machine_description(where.device),
        names.SHARDING: sharding.description(decided.train, where.precision),
        **decided.tags(),
    }


def shape_tags(run: RunSpec, parts: MetaBlocks) -> dict[str, str]:
    """What the report's #heads / d / GN columns and the fits' parameter counts read from MLflow, read off
    the run's model on `meta` (`parts`)."""
    from ablate.model.cost import attention_shape, model_cost

    shape = attention_shape(parts)
    budget = model_cost(parts, run.train.seq_len)
    return {
        names.HEADS: str(shape["heads"]),
        names.HEAD_WIDTH: str(shape["d"]),
        names.GROUP_NORM: shape["gn"],
        names.LAMBDA_INIT: shape["lambda_init"],
        names.PARAMS: str(budget.params),
        names.NON_EMBEDDING_PARAMS: str(budget.non_embedding_params),
        names.FWD_FLOPS_PER_TOKEN: str(budget.fwd_flops_per_token),
        names.TOKENS: str(run.train.tokens),
    }


def run_attention_kernel(model: ModelConfig | MetaBlocks, seq_len: int, where: Placement) -> str:
    """The attention core the layers of `model` (the run's, as it trains) use where the run is placed
    (what `auto` resolves to, which depends on the CPU kind as well as the dtype; on CUDA the backend
    measured fastest), so a rerun elsewhere is explainable from MLflow."""
    from ablate.hardware.precision import compute_dtype

    parts = model if isinstance(model, MetaBlocks) else meta_blocks(model)
    return attention_kernel(
        parts, torch.device(where.device), compute_dtype(where.precision), seq_len=seq_len
    )


def metric_sink(client: Any, run_id: str) -> Sink:
    def sink(metrics: dict[str, float], step: int) -> None:
        tokens_axis.log_metrics(client, run_id, metrics, step)  # and each against tokens

    return sink


def record_data(client: Any, run_id: str, run: RunSpec, data: Any) -> None:
    """The run's data as its MLflow record says it: `data.json`, and its passes over the training split."""
    client.log_batch(run_id, params=[])  # fail fast if the store went away
    tracking.log_text(client, run_id, json.dumps(data.describe(), indent=2), "data.json")
    _record_passes(client, run_id, run, data)


def _record_passes(client: Any, run_id: str, run: RunSpec, data: Any) -> None:
    """Tag the run with its training split's tokens and its passes over them (ablate.data.passes), and
    say so when it reads its text more than once. A task generates fresh samples: nothing to count."""
    from ablate.core.tables import si
    from ablate.data import passes

    if not hasattr(data, "train"):
        return
    split = int(len(data.train))
    p = passes.passes(run.train.tokens, split)
    client.set_tag(run_id, names.TRAIN_SPLIT_TOKENS, str(split))
    client.set_tag(run_id, names.PASSES, f"{p:.4f}")
    if passes.repeats(p):
        print(
            f"{passes.REPEATS} {run.name}: {si(run.train.tokens)} tokens are {p:.2f} passes over the "
            f"{si(split)} training tokens of {run.data.source}: it reads text again",
            flush=True,
        )


def log_final_metrics(sink: Sink, result: TrainResult, *, compiled: bool) -> None:
    sink({"mean_tokens_per_s": result.mean_tokens_per_s}, result.steps)
    if compiled:  # the whole run's, validation's compiling included
        sink({"compile_s": result.compile_seconds}, result.steps)


def mark_failed(client: Any, run_id: str, reason: str) -> None:
    client.set_tag(run_id, names.FAILURE_REASON, reason)
    client.set_terminated(run_id, status="FAILED")


def already_finished(client: Any, run_id: str, state: str, folder: Path) -> TrainResult | None:
    """The run's saved result if it finished before (its MLflow run then finished too), else None."""
    saved = _saved_result(folder / "result.json")
    if saved is None:
        return None
    if "tokens_per_s" in saved:  # written before the field said it is the run's mean
        saved["mean_tokens_per_s"] = saved.pop("tokens_per_s")
    done = TrainResult(**{**saved, "status": "already-finished", "run_id": run_id})
    if state != "finished":  # killed between the result and the MLflow bookkeeping: finish that
        finish_in_mlflow(client, run_id, done)
    return done


def write_result(folder: Path, result: TrainResult) -> None:
    """`result.json`, written under another name and renamed: a kill leaves the old file or the new one."""
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / "result.json.partial"
    partial.write_text(json.dumps({k: v for k, v in asdict(result).items() if k not in ("status", "run_id")}))
    partial.replace(folder / "result.json")


def finish_in_mlflow(client: Any, run_id: str, result: TrainResult) -> None:
    summary = {**{k: v for k, v in asdict(result).items() if k != "history"}, "status": "finished"}
    tracking.log_json(client, run_id, summary, "final_metrics.json")
    if result.triton_launches:  # chosen at the kernels' first launch, so known only now
        client.set_tag(run_id, names.TRITON_LAUNCH, json.dumps(result.triton_launches))
    client.set_terminated(run_id, status="FINISHED")


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
