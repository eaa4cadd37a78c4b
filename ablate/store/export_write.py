"""Writing a study's export (ablate.store.export): its runs, read through an MLflow client, and its
Optuna study, into the two parquet files beside its report.

Tags MLflow sets about the machine (`mlflow.user`, `mlflow.source.*`) are left out: they name a user and
a path of the machine that trained, which a reader does not have and no report uses.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from ablate.store import names
from ablate.store.commands import portable_command
from ablate.store.export import METRICS_FILE, RUNS_FILE

ARTIFACTS = ("resolved_recipe.yaml", "data.json", "final_metrics.json")
MACHINE_TAGS = ("mlflow.user", "mlflow.source.")


def write_export(client: Any, study: Any, report: dict[str, Any], folder: Path) -> list[Path]:
    """Write `study`'s runs (read through `client`) into `folder`; `report` says what the report was
    written with (recipe path, scale, seeds, search). Returns the files written."""
    import pyarrow as pa

    trials = study.get_trials(deepcopy=False)
    run_ids = sorted(
        {
            value
            for t in trials
            for key, value in t.user_attrs.items()
            if (key == "mlflow_run_id" or key.startswith("budget_run:")) and value
        }
    )
    runs: dict[str, list] = {k: [] for k in ("run_id", "status", "tags", "params", "metrics", "artifacts")}
    series: dict[str, list] = {"run_id": [], "key": [], "step": [], "value": []}
    for run_id in run_ids:
        run = client.get_run(run_id)
        metrics = run.data.metrics
        runs["run_id"].append(run_id)
        runs["status"].append(run.info.status)
        tags = {k: v for k, v in run.data.tags.items() if not k.startswith(MACHINE_TAGS)}
        runs["tags"].append(_json(tags))
        runs["params"].append(_json(run.data.params))
        runs["metrics"].append(_json(metrics))
        runs["artifacts"].append(_json(_artifacts(client, run_id)))
        for key in sorted(metrics):
            for m in client.get_metric_history(run_id, key):
                series["run_id"].append(run_id)
                series["key"].append(key)
                series["step"].append(m.step)
                series["value"].append(m.value)
    attrs = dict(study.user_attrs)
    if attrs.get("command"):  # the command as a reader can run it: no place of this machine in it
        attrs["command"] = portable_command(attrs["command"])
    meta = {"study": study.study_name, "user_attrs": attrs, "report": report}
    meta["trials"] = [_trial(t) for t in trials]
    folder.mkdir(parents=True, exist_ok=True)
    runs_table = pa.table(runs).replace_schema_metadata({names.EXPORT_METADATA_KEY: _json(meta)})
    metrics_table = pa.table(
        {
            "run_id": pa.array(series["run_id"], pa.string()).dictionary_encode(),
            "key": pa.array(series["key"], pa.string()).dictionary_encode(),
            "step": pa.array(series["step"], pa.int64()),
            "value": pa.array(series["value"], pa.float64()),
        }
    )
    written = []
    for table, name in ((runs_table, RUNS_FILE), (metrics_table, METRICS_FILE)):
        _write_parquet(table, folder / name)
        written.append(folder / name)
    return written


def _write_parquet(table: Any, path: Path) -> None:
    import pyarrow.parquet as pq

    # no statistics (min/max per page: bytes no reader here uses); zstd: the series compress about 3x
    pq.write_table(table, path, compression="zstd", write_statistics=False)


def _json(value: Any) -> str:
    return json.dumps(value)  # in the order the store gave: a report reading the export sees the same order


def _artifacts(client: Any, run_id: str) -> dict[str, str]:
    """The run's ARTIFACTS it has (an unfinished run lacks some); one that cannot be read is said in a line
    naming the run and the error, and left out."""
    from ablate.store import tracking

    out = {}
    for name in ARTIFACTS:
        try:
            text = tracking.artifact_text(client, run_id, name)
        except tracking.ArtifactUnreadable as e:
            print(f"[export] {e}; the export holds the run without it", flush=True)
            continue
        if text is not None:
            out[name] = text
    return out


def _trial(trial: Any) -> dict[str, Any]:
    from optuna.distributions import distribution_to_json

    def when(t: datetime.datetime | None) -> str | None:
        return t.isoformat() if t else None

    return {
        "number": trial.number,
        "state": trial.state.name,
        "value": trial.value,
        "start": when(trial.datetime_start),
        "complete": when(trial.datetime_complete),
        "params": trial.params,
        "distributions": {k: distribution_to_json(d) for k, d in trial.distributions.items()},
        "user_attrs": trial.user_attrs,
    }
