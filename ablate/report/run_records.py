"""A finished sweep's runs as records: one `RunRecord` per plan (its latest trial, Optuna) with its MLflow
run's final metrics, tags, params and curves; a budgeted study's branches too. Every report reads these;
never imports a model."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ablate.data import passes as data_passes
from ablate.store import names

if TYPE_CHECKING:
    from ablate.store.study import SweepContext


METRICS = (("valid", "val/loss"), ("ar_hit", "val/ar_hit"), ("others", "val/others"))


TRAIN_LOSS_POINTS = 5  # the training loss at a run's end: the mean of its last 5 logged values


@dataclass
class RunRecord:
    variant: str
    seed: int
    size: str
    state: str  # finished | failed | pruned | running | waiting
    run_id: str | None
    values: dict[str, float] = field(default_factory=dict)  # valid, ar_hit, others, ar_hit_share
    reason: str = ""
    searched: dict[str, Any] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    curve: list[tuple[float, float]] = field(default_factory=list)  # (tokens, val loss)
    params: dict[str, str] = field(default_factory=dict)  # the run's MLflow params (flattened config)
    layer_curves: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # rms/..., lambda/...
    branched_from: str = ""  # a budget's run: the MLflow run it branched off (ablate.train.branches)
    split_tokens: float = math.nan  # tokens of the training split it drew from (nan: a task, or unknown)

    @property
    def tokens(self) -> int:
        """Training tokens of the run (its budget), from its tags; 0 if not recorded."""
        return int(self.tags.get(names.TOKENS, 0))

    @property
    def passes(self) -> float:
        """Passes the run made over its training split (ablate.data.passes); nan if unknown."""
        return data_passes.passes(self.tokens, self.split_tokens) if self.tokens else math.nan

    @property
    def sampling(self) -> str:
        """How the run drew its training windows (`data.sampling`; `random` where it did not record it)."""
        return data_passes.sampling_of(self.params)


def collect(
    ctx: SweepContext, study: Any, with_curves: bool = True, budgets: bool = False
) -> list[RunRecord]:
    """One record per plan: its latest trial (`reported_trials`), with the MLflow run's final metrics; with
    `budgets`, also one record per smaller budget's run of each trial (its branches, ablate.train.branches)."""
    from optuna.trial import TrialState

    from ablate.store.study import reported_trials

    client = ctx.stores.client()
    latest = reported_trials(study.get_trials(deepcopy=False))  # later trials (retries, extensions) win
    states = {
        TrialState.COMPLETE: "finished",
        TrialState.FAIL: "failed",
        TrialState.PRUNED: "pruned",
        TrialState.RUNNING: "running",
        TrialState.WAITING: "waiting",
    }
    records = []
    for trial in latest.values():
        attrs = trial.user_attrs
        searched = {k: v for k, v in trial.params.items() if k.startswith("base.")}
        plan = json.loads(attrs.get("plan") or "{}")
        record = RunRecord(
            variant=plan.get("variant", "?"),
            seed=int(plan.get("seed", -1)),
            size=plan.get("size", ""),
            state=states.get(trial.state, str(trial.state)),
            run_id=attrs.get("mlflow_run_id"),
            reason=attrs.get("failure_reason", ""),
            searched=searched,
        )
        if record.run_id:
            _read_run(client, record, with_curves)
        if record.state != "finished":  # a failed run's last numbers are not results
            record.values = {k: math.nan for k in ("valid", "ar_hit", "others", "ar_hit_share")}
        records.append(record)
        if not budgets:
            continue
        for key, run_id in sorted(attrs.items()):
            if key.startswith("budget_run:") and run_id != record.run_id:
                branch = RunRecord(
                    variant=record.variant,
                    seed=record.seed,
                    size=record.size,
                    state="running",
                    run_id=run_id,
                    searched=searched,
                    branched_from=record.run_id or "",
                )
                status = _read_run(client, branch, with_curves)
                branch.state = {"FINISHED": "finished", "FAILED": "failed"}.get(status, "running")
                if branch.state != "finished":
                    branch.values = {k: math.nan for k in ("valid", "ar_hit", "others", "ar_hit_share")}
                records.append(branch)
    return records


def _read_run(client: Any, record: RunRecord, with_curves: bool) -> str:
    """Fill `record` from its MLflow run (final metrics, tags, params, curves); returns the run's status."""
    run = client.get_run(record.run_id)
    metrics = run.data.metrics
    record.values = {name: metrics.get(key, math.nan) for name, key in METRICS}
    record.values["ar_hit_share"] = metrics.get("val/ar_hit_share", math.nan)
    record.values["train"] = train_loss_at_end(client, record.run_id)
    record.tags = dict(run.data.tags)
    record.params = dict(run.data.params)
    record.split_tokens = split_tokens(client, record)
    if with_curves:
        tokens = {m.step: m.value for m in client.get_metric_history(record.run_id, "tokens")}
        record.curve = [
            (tokens.get(m.step, m.step), m.value)
            for m in client.get_metric_history(record.run_id, "val/loss")
        ]
        record.layer_curves = layer_curves(client, record.run_id, metrics, tokens)
    return run.info.status


def split_tokens(client: Any, record: RunRecord) -> float:
    """The training split's tokens the run drew from: its tag, or (runs trained before the tag) the
    `data.json` it logged; nan for a task's run or when neither is there."""
    from ablate.store.tracking import read_json_artifact

    if names.TRAIN_SPLIT_TOKENS in record.tags:
        return float(record.tags[names.TRAIN_SPLIT_TOKENS])
    data = read_json_artifact(client, record.run_id, "data.json") or {}
    return float(data.get("train_tokens", math.nan))


def train_loss_at_end(client: Any, run_id: str, last: int = TRAIN_LOSS_POINTS) -> float:
    """The mean of the run's last `last` logged training losses: its training loss where its validation
    loss was taken, to set beside it (a generalization gap); nan if it logged none."""
    values = [m.value for m in client.get_metric_history(run_id, "train/loss")][-last:]
    values = [v for v in values if math.isfinite(v)]
    return sum(values) / len(values) if values else math.nan


def common_split(records: list[RunRecord]) -> float:
    """The training split's tokens the runs share (nan when unknown or when they differ)."""
    splits = {r.split_tokens for r in records if math.isfinite(r.split_tokens)}
    return splits.pop() if len(splits) == 1 else math.nan


def layer_curves(
    client: Any,
    run_id: str,
    metrics: dict[str, float],
    tokens: dict[int, float],
) -> dict[str, list[tuple[float, float]]]:
    """The per-layer statistics a run logged at its validations (ablate.train.layer_stats, lambda/layer_NN)."""
    from ablate.report.checks import LAYER_PREFIXES

    return {
        key: [(tokens.get(m.step, m.step), m.value) for m in client.get_metric_history(run_id, key)]
        for key in sorted(metrics)
        if key.startswith(LAYER_PREFIXES)
    }


def budgeted(r: RunRecord) -> bool:
    """Is this the run of a budgeted study's budget (ablate.train.branches tags it with its steps)?"""
    return bool(r.tags.get(names.BUDGET_STEPS))
