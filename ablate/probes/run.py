"""Probes (kind `probe`) on the finished runs of a recipe's sweep, logged to the same runs (`ablate eval`).

Where the runs come from: the sweep's Optuna study (`<recipe>[-<scale>]`), one record per planned run (a
retry replaces the attempt it retries), as `ablate report` and `ablate fit` read it; each COMPLETE trial
gives its RunSpec (the recipe resolved for the trial's plan, `SweepContext.run_for_plan`), its run folder
(`train.run_dir`: the checkpoints) and its MLflow run (the trial's `mlflow_run_id`). A run whose MLflow
run key differs from the recipe's (the recipe was edited since) is skipped and named.

Settings: the recipe's `eval:` section, each overridable on the command line:

    eval:
      tokens: 409600            # held-out tokens per run (Table 5: 0.4M); a scale may overlay it: scales.tiny.eval
      probes: [outliers, quantization]     # names, or {name: quantization, granularity: row}
      checkpoint: best          # best (lowest validation loss) | last
      after_trial: false        # probe each run at the end of its trial (`probe_after_trial`)

Held-out data: disjoint windows of seq_len + 1 tokens spread evenly over the validation split, as many as
the budget needs (capped by the split; the tokens used are logged as `probe/<probe>/tokens`).

Results: MLflow metrics `probe/<probe>/<name>` (step 0) of the run, and the tags `ablate.probe.<probe>`
(a hash of the probe's settings, the token budget and the checkpoint) and `ablate.probe.<probe>.settings`.
A probe's metrics and its tag go in one request, the tag last (MLflow's SQL store commits a batch's
metrics before its tags): a tagged probe has all its metrics, a run killed mid-eval keeps every probe it
finished, and a re-run probes exactly what has no tag. (A kill in the instant between those two commits
leaves untagged metrics that the re-run logs once more, at the same step 0.) Afterwards `ablate eval`
rewrites the report (which adds the probe tables and plots of `ablate.report.probes`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate.core import registry
from ablate.core.errors import UserError
from ablate.core.workspace import Workspace
from ablate.recipe.resolve import Recipe
from ablate.recipe.schema import RunSpec
from ablate.store import names
from ablate.store.stores import Stores

if TYPE_CHECKING:
    from ablate.store.study import SweepContext

CHECKPOINTS = ("best", "last")
METRIC_PREFIX = "probe/"


@dataclass(frozen=True)
class EvalSettings:
    tokens: int
    probes: tuple[Any, ...]  # probe specs: names or {name: ..., options}
    checkpoint: str
    after_trial: bool = False


@dataclass
class EvalSummary:
    probed: list[str] = field(default_factory=list)  # "run name: probe" done now
    skipped: list[str] = field(default_factory=list)  # already probed with the same settings
    left_out: list[str] = field(default_factory=list)  # runs that could not be probed, with the reason
    report: Path | None = None


# --- settings ------------------------------------------------------------------------------------------
def eval_settings(
    recipe: Recipe,
    scale: str,
    *,
    probes: list[Any] | None = None,
    checkpoint: str | None = None,
    tokens: int | None = None,
) -> EvalSettings:
    """The recipe's `eval:` section at `scale` (typed and checked by `Recipe.eval`), the command line's choices on top."""
    section = recipe.eval(scale)
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
        raise UserError(f"--tokens: expected a positive number of tokens, got {tokens!r}")
    checkpoint = checkpoint or section.checkpoint
    if checkpoint not in CHECKPOINTS:
        raise UserError(f"--checkpoint: {checkpoint!r} is not one of {', '.join(CHECKPOINTS)}")
    return EvalSettings(
        tokens=int(tokens or section.tokens),
        probes=tuple(probes or section.probes),
        checkpoint=checkpoint,
        after_trial=section.after_trial,
    )


def build_probes(settings: EvalSettings) -> dict[str, Any]:
    """name -> probe instance, built through the registry (unknown names fail here, before any work)."""
    from ablate.probes.base import Probe

    built: dict[str, Any] = {}
    for i, spec in enumerate(settings.probes):
        name = registry.spec_name(spec)
        if name in built:
            raise UserError(f"eval.probes[{i}]: {name!r} is listed twice")
        probe = registry.build("probe", spec, key=f"eval.probes[{i}]")
        if not isinstance(probe, Probe) and not (hasattr(probe, "run") and hasattr(probe, "settings")):
            raise UserError(f"eval.probes[{i}]: {name!r} is not a probe (needs run() and settings())")
        built[name] = probe
    return built


def probe_key(name: str, probe: Any, settings: EvalSettings) -> tuple[str, dict[str, Any]]:
    """(hash, settings dict) identifying this probe's results on a run: its class and options, the token
    budget and the checkpoint."""
    from ablate.probes.base import settings_key

    described = {
        "probe": name,
        "class": f"{type(probe).__module__}.{type(probe).__qualname__}",
        "options": probe.settings(),
        "tokens": settings.tokens,
        "checkpoint": settings.checkpoint,
    }
    return settings_key(described), described


# --- one run -------------------------------------------------------------------------------------------
def held_out_batches(run: RunSpec, workspace: Workspace, tokens: int):
    """(batches (B, seq_len + 1) of the validation split, target tokens they hold): as many evenly spread,
    disjoint windows as `tokens` needs, capped by the split, grouped by the run's micro-batch size."""
    import numpy as np
    import torch

    from ablate.data import load_tokens, val_starts

    cfg = run.train
    data = load_tokens(run.data, workspace)
    width = cfg.seq_len + 1
    windows = min(math.ceil(tokens / cfg.seq_len), len(data.val) // width)
    if windows < 1:
        raise UserError(
            f"eval.tokens: the validation split ({len(data.val)} tokens) holds no window of "
            f"{width} tokens (train.seq_len + 1)"
        )
    starts = val_starts(len(data.val), seq_len=cfg.seq_len, micro_batch_size=1, n_batches=windows)
    rows = torch.from_numpy(np.stack([np.asarray(data.val[s : s + width]) for s in starts]).astype(np.int64))
    return list(rows.split(cfg.micro_batch_size)), windows * cfg.seq_len


def load_model(run: RunSpec, workspace: Workspace, checkpoint: str):
    """The run's model with the weights of its `best` or `last` checkpoint (weights only), in eval mode: a
    file, or an fsdp run's sharded folder gathered (ablate.train.checkpoint_files)."""
    from ablate.model.decoder import build_model
    from ablate.train import checkpoint_files
    from ablate.train.resume import run_dir

    path = run_dir(workspace, run) / "checkpoints" / f"{checkpoint}.ckpt"
    if not path.exists():
        raise FileNotFoundError(f"no {checkpoint} checkpoint at {path}")
    weights = checkpoint_files.model_weights(path)
    model = build_model(run.model, seed=run.seed)
    model.load_state_dict(weights)
    return model.eval()


def probe_run(
    run: RunSpec,
    run_id: str,
    probes: dict[str, Any],
    settings: EvalSettings,
    *,
    workspace: Workspace,
    client: Any,
) -> tuple[list[str], list[str]]:
    """Run every probe the MLflow run `run_id` lacks (by settings hash); returns (probed, skipped) names."""
    tags = client.get_run(run_id).data.tags
    todo, skipped = {}, []
    for name, probe in probes.items():
        key, described = probe_key(name, probe, settings)
        if tags.get(names.probe_tag(name)) == key:
            skipped.append(name)
        else:
            todo[name] = (probe, key, described)
    if not todo:
        return [], skipped
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # float32 either way
    model = load_model(run, workspace, settings.checkpoint).to(device)
    batches, used = held_out_batches(run, workspace, settings.tokens)
    batches = [b.to(device) for b in batches]
    done = []
    for name, (probe, key, described) in todo.items():
        started = time.perf_counter()
        results = probe.run(model, batches)
        results = {**results, "tokens": float(used)}
        _log_probe(
            client,
            run_id,
            name,
            results,
            key,
            {**described, "tokens_used": used, "seconds": round(time.perf_counter() - started, 2)},
        )
        done.append(name)
    return done, skipped


def _log_probe(
    client: Any, run_id: str, name: str, results: dict[str, float], key: str, described: dict[str, Any]
) -> None:
    """The probe's metrics, then its tag, in as few requests as MLflow allows (1000 metrics each); the tag
    rides in the last one, committed after its metrics, so it exists only when every metric does."""
    from mlflow.entities import Metric, RunTag

    now = int(time.time() * 1000)
    metrics = [
        Metric(f"{METRIC_PREFIX}{name}/{k}", float(v), now, 0)
        for k, v in results.items()
        if v is not None and math.isfinite(float(v))
    ]
    tags = [
        RunTag(names.probe_settings_tag(name), json.dumps(described, sort_keys=True, default=str)[:5000]),
        RunTag(names.probe_tag(name), key),
    ]
    chunks = [metrics[i : i + 1000] for i in range(0, len(metrics), 1000)] or [[]]
    for chunk in chunks[:-1]:
        client.log_batch(run_id, metrics=chunk)
    client.log_batch(run_id, metrics=chunks[-1], tags=tags)


# --- the study -----------------------------------------------------------------------------------------
def finished_runs(ctx: SweepContext, study: Any, client: Any) -> tuple[list[tuple[RunSpec, str]], list[str]]:
    """(RunSpec, MLflow run id) of every plan whose latest trial is COMPLETE; and the runs left out, why."""
    from optuna.trial import TrialState

    from ablate.store.study import latest_trials, trial_plan

    latest = latest_trials(study.get_trials(deepcopy=False))  # later trials (retries) win
    runs, left_out = [], []
    for trial in latest.values():
        plan = trial_plan(trial)
        name = trial.user_attrs.get("run_name") or f"{plan.get('variant')}-s{plan.get('seed')}"
        run_id = trial.user_attrs.get("mlflow_run_id")
        if trial.state != TrialState.COMPLETE or not run_id:
            left_out.append(f"{name}: {trial.state.name.lower()}")
            continue
        run = ctx.run_for_plan(plan, {k: v for k, v in trial.params.items() if k.startswith("base.")})
        recorded = client.get_run(run_id).data.tags.get(names.RUN_KEY)
        if recorded != run.key:
            left_out.append(
                f"{name}: trained from another version of the recipe (run key {recorded}, "
                f"the recipe now gives {run.key})"
            )
            continue
        runs.append((run, run_id))
    return runs, left_out


def probe_after_trial(recipe: Recipe, run: RunSpec, run_id: str, stores: Stores) -> list[str]:
    """The sweep's hook, for the end of a trial: when the recipe's `eval.after_trial` is true, probe this
    finished run with the recipe's eval settings at the run's scale (the same tags as `ablate eval`, which
    will then skip it). Returns the probes run ([] when after_trial is off or all were done)."""
    settings = eval_settings(recipe, run.scale)
    if not settings.after_trial:
        return []
    done, _ = probe_run(
        run, run_id, build_probes(settings), settings, workspace=stores.workspace, client=stores.client()
    )
    return done
