"""A study's runs in two parquet files beside its report, so the report can be rebuilt with no store.

`runs.parquet` holds one row per MLflow run of the study's trials (every budget's run too): its status,
tags, params (the flattened resolved config), latest metrics, and the small JSON/YAML artifacts the run
logged (`resolved_recipe.yaml`, `data.json`, `final_metrics.json`). Its parquet metadata holds the Optuna
study: its user attributes (the command that made it, ...) and every trial (state, params, times), plus
what the report was written with (recipe, scale, seeds, search spec). `metrics.parquet` holds every
logged metric series, one row per (run, key, step) in the order MLflow returned them. Writing one is
ablate.store.export_write; every field read back is checked first (ablate.store.export_checks).

Reading it back gives the two things a report reads, each the real type, so the report code has one path
whatever its source: an Optuna study in Optuna's in-memory storage, and `ExportedRuns`, which answers the
read calls a report makes of an `MlflowClient` (`get_run`, `get_metric_history`, `download_artifacts`)
with MLflow's own entities. Why not a real MLflow store: MLflow cannot create a run under a given run id,
and the reports name their runs by id.
"""

from __future__ import annotations

import contextlib
import datetime
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ablate.core.errors import UserError
from ablate.store import names
from ablate.store.export_checks import (
    RESTORE,
    check_is_data,
    check_metric_columns,
    check_runs,
    check_settings,
    check_study,
    read_parquet,
)

RUNS_FILE = "runs.parquet"
METRICS_FILE = "metrics.parquet"
FILES = (RUNS_FILE, METRICS_FILE)
SCHEME = "export:"  # a tracking URI `export:FOLDER` reads the runs of FOLDER's export (Stores.client)


def has_export(folder: Path) -> bool:
    return all((Path(folder) / name).is_file() for name in FILES)


def read_meta(folder: Path) -> dict[str, Any]:
    """The export's study and report settings (see the module doc); one line if `folder` has no export."""
    import pyarrow.parquet as pq

    folder = Path(folder)
    if not has_export(folder):
        raise UserError(
            f"--from: {folder} has no export ({' and '.join(FILES)}); `ablate report` or `ablate sweep` "
            "writes one beside the report"
        )
    meta = read_parquet(folder / RUNS_FILE, pq.read_schema).metadata or {}
    if names.EXPORT_METADATA_KEY not in meta:
        raise UserError(f"--from: {folder / RUNS_FILE} holds no study (not written by ablate)")
    try:
        meta = json.loads(meta[names.EXPORT_METADATA_KEY])
    except ValueError as e:
        raise UserError(f"--from: {folder / RUNS_FILE}: its study is not JSON ({e}); {RESTORE}") from None
    if not isinstance(meta, dict):
        raise UserError(
            f"--from: {folder / RUNS_FILE}: its study is {type(meta).__name__}, not a mapping; {RESTORE}"
        )
    check_settings(meta.get("report"), folder / RUNS_FILE)
    check_study(meta, folder / RUNS_FILE)
    return meta


NAMED_FILES = {"recipe": "recipe", "search": "search spec"}  # the YAML files an export's settings name


@contextlib.contextmanager
def reading(folder: Path) -> Iterator[dict[str, Any]]:
    """The one way `--from` reads an export: its report settings (`read_meta`: every field checked), with
    every file they name read as data first (`check_is_data`), and, while the caller rebuilds from them,
    no module path resolved anywhere (ablate.core.registry.importing_nothing): an export never runs code,
    whatever it holds or names. Registered components (installed code) still build."""
    from ablate.core import registry

    settings = read_meta(folder)["report"]
    for key, what in NAMED_FILES.items():
        if settings.get(key):
            check_is_data(Path(settings[key]), what)
    why = f"--from {folder}: an export is data and never runs code; write the report from its store instead"
    with registry.importing_nothing(why):
        yield settings


def exported_study(folder: Path) -> Any:
    """The export's Optuna study, rebuilt in Optuna's in-memory storage (trials, their times and attributes)."""
    import optuna
    from optuna.distributions import json_to_distribution
    from optuna.trial import FrozenTrial, TrialState

    meta = read_meta(folder)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=meta["study"], storage=optuna.storages.InMemoryStorage())
    for key, value in meta["user_attrs"].items():
        study.set_user_attr(key, value)
    for t in meta["trials"]:
        state = TrialState[t["state"]]

        def when(text: str | None) -> datetime.datetime | None:
            return datetime.datetime.fromisoformat(text) if text else None

        # A trial failed while still waiting (withdrawn before a worker took it) has no start; Optuna only
        # admits that for a waiting trial, so it is rebuilt as starting when it ended.
        start = when(t["start"]) or (when(t["complete"]) if state != TrialState.WAITING else None)
        study.add_trial(
            FrozenTrial(
                number=t["number"],
                state=state,
                value=t["value"] if state == TrialState.COMPLETE else None,
                datetime_start=start,
                datetime_complete=when(t["complete"]),
                params=t["params"],
                distributions={k: json_to_distribution(d) for k, d in t["distributions"].items()},
                user_attrs=t["user_attrs"],
                system_attrs={},
                intermediate_values={},
                trial_id=t["number"],
            )
        )
    return study


class ExportedRuns:
    """The runs of an export, answering the read calls a report makes of an `MlflowClient`."""

    def __init__(self, folder: Path) -> None:
        import pyarrow.parquet as pq

        read_meta(folder)  # one line if there is no export
        self.tracking_uri = SCHEME + str(folder)
        runs = read_parquet(Path(folder) / RUNS_FILE, pq.read_table).to_pylist()
        self._runs = {r.get("run_id"): r for r in runs if isinstance(r, dict)}
        check_runs(runs, Path(folder) / RUNS_FILE)
        self._series: dict[tuple[str, str], list[tuple[int, float]]] = {}
        check_metric_columns(Path(folder) / METRICS_FILE)
        columns = read_parquet(Path(folder) / METRICS_FILE, pq.read_table).to_pydict()
        for run_id, key, step, value in zip(
            columns["run_id"], columns["key"], columns["step"], columns["value"], strict=True
        ):
            self._series.setdefault((run_id, key), []).append((step, value))

    def _row(self, run_id: str) -> dict[str, Any]:
        if run_id not in self._runs:
            raise UserError(
                f"--from: run {run_id!r}, named by the export's study, is not in {self.tracking_uri[len(SCHEME) :]}"
                f"/{RUNS_FILE}; {RESTORE}"
            )
        return self._runs[run_id]

    def get_run(self, run_id: str) -> Any:
        from mlflow.entities import Metric, Param, Run, RunData, RunInfo, RunTag

        row = self._row(run_id)
        metrics = [Metric(k, v, 0, 0) for k, v in json.loads(row["metrics"]).items()]
        params = [Param(k, v) for k, v in json.loads(row["params"]).items()]
        tags = [RunTag(k, v) for k, v in json.loads(row["tags"]).items()]
        info = RunInfo(run_id, "", "", row["status"], 0, None, "active")
        return Run(info, RunData(metrics=metrics, params=params, tags=tags))

    def get_metric_history(self, run_id: str, key: str) -> list[Any]:
        from mlflow.entities import Metric

        self._row(run_id)
        return [Metric(key, value, 0, step) for step, value in self._series.get((run_id, key), [])]

    def download_artifacts(self, run_id: str, path: str, dst_path: str) -> str:
        artifacts = json.loads(self._row(run_id)["artifacts"])
        if path not in artifacts:
            raise FileNotFoundError(f"run {run_id} has no artifact {path} in the export")
        out = Path(dst_path) / path
        out.write_text(artifacts[path])
        return str(out)
