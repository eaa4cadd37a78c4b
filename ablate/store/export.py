"""A study's runs in two parquet files beside its report, so the report can be rebuilt with no store.

`runs.parquet` holds one row per MLflow run of the study's trials (every budget's run too): its status,
tags, params (the flattened resolved config), latest metrics, and the small JSON/YAML artifacts the run
logged (`resolved_recipe.yaml`, `data.json`, `final_metrics.json`). Its parquet metadata holds the Optuna
study: its user attributes (the command that made it, ...) and every trial (state, params, times), plus
what the report was written with (recipe, scale, seeds, search spec). `metrics.parquet` holds every
logged metric series, one row per (run, key, step) in the order MLflow returned them.

Reading it back gives the two things a report reads, each the real type, so the report code has one path
whatever its source: an Optuna study in Optuna's in-memory storage, and `ExportedRuns`, which answers the
read calls a report makes of an `MlflowClient` (`get_run`, `get_metric_history`, `download_artifacts`)
with MLflow's own entities. Why not a real MLflow store: MLflow cannot create a run under a given run id,
and the reports name their runs by id.

Tags MLflow sets about the machine (`mlflow.user`, `mlflow.source.*`) are left out: they name a user and
a path of the machine that trained, which a reader does not have and no report uses.
"""

from __future__ import annotations

import contextlib
import datetime
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ablate.core import fields
from ablate.core.errors import UserError
from ablate.store import names
from ablate.store.commands import portable_command

RUNS_FILE = "runs.parquet"
METRICS_FILE = "metrics.parquet"
FILES = (RUNS_FILE, METRICS_FILE)
SCHEME = "export:"  # a tracking URI `export:FOLDER` reads the runs of FOLDER's export (Stores.client)
ARTIFACTS = ("resolved_recipe.yaml", "data.json", "final_metrics.json")
MACHINE_TAGS = ("mlflow.user", "mlflow.source.")


def has_export(folder: Path) -> bool:
    return all((Path(folder) / name).is_file() for name in FILES)


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


def read_meta(folder: Path) -> dict[str, Any]:
    """The export's study and report settings (see the module doc); one line if `folder` has no export."""
    import pyarrow.parquet as pq

    folder = Path(folder)
    if not has_export(folder):
        raise UserError(
            f"--from: {folder} has no export ({' and '.join(FILES)}); `ablate report` or `ablate sweep` "
            "writes one beside the report"
        )
    meta = _parquet(folder / RUNS_FILE, pq.read_schema).metadata or {}
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


RESTORE = "restore the folder from git (git checkout -- FOLDER) or write the report again from its store"


def _parquet(path: Path, read: Any) -> Any:
    """`read(path)`, a damaged file (truncated, not parquet) one line naming it."""
    import pyarrow as pa

    try:
        return read(path)
    except (pa.ArrowException, OSError) as e:
        raise UserError(f"--from: {path} cannot be read ({str(e).splitlines()[0]}); {RESTORE}") from None


def relative_inside(value: Any) -> bool:
    """A non-empty relative path with no '..': inside the checkout it is read from."""
    return (
        isinstance(value, str)
        and bool(value)
        and not Path(value).is_absolute()
        and ".." not in Path(value).parts
    )


def check_settings(settings: Any, where: Path) -> None:
    """An export is data, never code: `--from` takes from it only the recipe path (relative, inside this
    checkout), the search spec's, a grid fit's compared folder's and a report's compared folders', the scale, the seeds, and `base.*`
    overrides of plain values (a string, number, bool or null, or a list of them), nothing that imports
    (`class_path`, `imports`) or sets a key outside `base`. Anything else is one line: a crafted export
    must not run code here."""

    def bad(key: str, what: str) -> UserError:
        return UserError(f"--from: {where}: report.{key} {what}; an export holds data, not code: {RESTORE}")

    if not isinstance(settings, dict):
        raise bad("", "is missing")
    for key in ("recipe", "search"):
        value = settings.get(key)
        if value is None and key == "search":
            continue
        if not relative_inside(value):
            raise bad(key, f"is {value!r}, not a relative path inside this checkout (no '..')")
    if not isinstance(settings.get("scale"), str | None):
        raise bad("scale", f"is {settings.get('scale')!r}, not a name")
    seeds = settings.get("seeds", [])
    if not isinstance(seeds, list) or not all(type(s) is int for s in seeds):
        raise bad("seeds", f"is {seeds!r}, not a list of integers")
    if not _plain(settings.get("grace_period")) or isinstance(settings.get("grace_period"), list):
        raise bad("grace_period", f"is {settings.get('grace_period')!r}, not a number")
    fit = settings.get("fit", {})
    if not isinstance(fit, dict) or not all(_plain(v) and not isinstance(v, list) for v in fit.values()):
        raise bad("fit", f"is {fit!r}, not a mapping of plain values")
    compared = fit.get("compare_with")
    if compared is not None and not relative_inside(compared):
        raise bad("fit.compare_with", f"is {compared!r}, not a relative path inside this checkout (no '..')")
    if fit:
        for key, kind in (("form", str), ("params_count", str), ("seed", int), ("bootstrap", int)):
            if type(fit.get(key)) is not kind:
                raise bad(
                    f"fit.{key}", f"is {fit.get(key)!r}, not {'a name' if kind is str else 'an integer'}"
                )
        if not 0 <= fit["bootstrap"] <= MAX_BOOTSTRAP:
            raise bad("fit.bootstrap", f"is {fit['bootstrap']}, outside 0 to {MAX_BOOTSTRAP:,} resamples")
    folders = settings.get("compare_with", [])
    if not isinstance(folders, list) or not all(relative_inside(f) for f in folders):
        raise bad(
            "compare_with", f"is {folders!r}, not a list of relative paths inside this checkout (no '..')"
        )
    overrides = settings.get("overrides", [])
    if not isinstance(overrides, list):
        raise bad("overrides", f"is {overrides!r}, not a list")
    for item in overrides:
        if not (isinstance(item, list | tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise bad("overrides", f"holds {item!r}, not a [key, value] pair")
        key, value = item
        parts = key.split(".")
        if parts[0] != "base" or len(parts) < 2 or not all(p.isidentifier() for p in parts[1:]):
            raise bad("overrides", f"sets {key!r}; only base.* keys may be set from an export")
        if set(parts) & CODE_KEYS:
            raise bad("overrides", f"sets {key!r}, which imports code")
        if not _plain(value):
            raise bad(
                "overrides",
                f"sets {key!r} to {value!r}; only plain values (strings, numbers, booleans, null or lists of them)",
            )


CODE_KEYS = {"class_path", "init_args", "imports"}


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


def check_is_data(path: Path, what: str) -> None:
    """A YAML file an export names (`NAMED_FILES`), read as data before it is loaded: one that lists
    `imports:` or names a `class_path` anywhere, as a key or a part of a dotted key (a search spec's
    `base.model.attention.class_path`), is one line naming the file and the key, whichever folder holds
    it."""
    from ablate.core.config import read_yaml_file

    path = Path(path)
    if not path.is_file():
        return  # load_recipe and load_search_spec say so in their own line
    raw = read_yaml_file(path, what)

    def code_keys(node: Any, at: str) -> str | None:
        if isinstance(node, dict):
            for key, value in node.items():
                here = f"{at}.{key}" if at else str(key)
                parts = str(key).split(".")
                if "class_path" in parts or (parts[-1] == "imports" and value):
                    return here
                if (found := code_keys(value, here)) is not None:
                    return found
        elif isinstance(node, list):
            for i, value in enumerate(node):
                if (found := code_keys(value, f"{at}[{i}]")) is not None:
                    return found
        return None

    if (key := code_keys(raw, "")) is not None:
        raise UserError(
            f"--from: the export's {what} {path} sets {key}, which imports code, and an export never runs "
            "code; write the report from its store instead"
        )


MAX_BOOTSTRAP = 100_000  # resamples an export may ask for (the CLI's default is 1,000)
MAX_TRIALS = 100_000  # trials (and runs) an export may hold: a crafted one must not run for hours
STATES = ("RUNNING", "COMPLETE", "PRUNED", "FAIL", "WAITING")


def check_study(meta: dict[str, Any], where: Path) -> None:
    """The study an export holds, field by field, before anything is built from it: a malformed or
    oversized field is one line naming it (a crafted export ends there, not in a traceback)."""
    from optuna.distributions import json_to_distribution

    def bad(key: str, what: str) -> UserError:
        return UserError(f"--from: {where}: {key} {what}; {RESTORE}")

    if not isinstance(meta.get("study"), str):
        raise bad("study", f"is {meta.get('study')!r}, not a name")
    if not isinstance(meta.get("user_attrs"), dict):
        raise bad("user_attrs", f"is {type(meta.get('user_attrs')).__name__}, not a mapping")
    for name in (names.PARENT_RUN_ATTR, "command"):
        if name in meta["user_attrs"]:
            fields.field(
                f"--from: {where}", f"user_attrs.{name}", meta["user_attrs"][name], fields.TEXT, RESTORE
            )
    trials = meta.get("trials")
    if not isinstance(trials, list):
        raise bad("trials", f"is {type(trials).__name__}, not a list")
    if len(trials) > MAX_TRIALS:
        raise bad("trials", f"holds {len(trials):,} trials, more than {MAX_TRIALS:,}")
    for i, t in enumerate(trials):
        key = f"trials[{i}]"
        if not isinstance(t, dict):
            raise bad(key, f"is {type(t).__name__}, not a mapping")
        if type(t.get("number")) is not int or t["number"] < 0:
            raise bad(f"{key}.number", f"is {t.get('number')!r}, not a trial number")
        if t.get("state") not in STATES:
            raise bad(f"{key}.state", f"is {t.get('state')!r}, not one of {', '.join(STATES)}")
        value = t.get("value")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise bad(f"{key}.value", f"is {value!r}, not a number")
        for when in ("start", "complete"):
            text = t.get(when)
            try:
                if text is not None:
                    datetime.datetime.fromisoformat(text)
            except (TypeError, ValueError):
                raise bad(f"{key}.{when}", f"is {text!r}, not an ISO date and time") from None
        for field in ("params", "distributions", "user_attrs"):
            if not isinstance(t.get(field), dict):
                raise bad(f"{key}.{field}", f"is {type(t.get(field)).__name__}, not a mapping")
        _check_trial_attrs(t["user_attrs"], f"--from: {where}", f"{key}.user_attrs.")
        if set(t["params"]) != set(t["distributions"]):
            missing = sorted(set(t["params"]) ^ set(t["distributions"]))
            raise bad(f"{key}.distributions", f"does not match its params (differ in {missing})")
        for name, text in t["distributions"].items():
            try:
                distribution = json_to_distribution(text)
                distribution._contains(distribution.to_internal_repr(t["params"][name]))
            except Exception:  # noqa: BLE001 -- whatever Optuna raises on a crafted distribution
                raise bad(
                    f"{key}.distributions.{name}",
                    f"is {str(text)[:80]!r}, not an Optuna distribution of {t['params'][name]!r}",
                ) from None


def _plain(value: Any) -> bool:
    """A string, number, bool or None, or a list of them."""
    if isinstance(value, list):
        return all(_plain(v) and not isinstance(v, list) for v in value)
    return value is None or isinstance(value, str | int | float | bool)


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
        runs = _parquet(Path(folder) / RUNS_FILE, pq.read_table).to_pylist()
        self._runs = {r.get("run_id"): r for r in runs if isinstance(r, dict)}
        _check_runs(runs, Path(folder) / RUNS_FILE)
        self._series: dict[tuple[str, str], list[tuple[int, float]]] = {}
        _check_metric_columns(Path(folder) / METRICS_FILE)
        columns = _parquet(Path(folder) / METRICS_FILE, pq.read_table).to_pydict()
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


# The fields of an export a report reads as more than text, each with its kind (ablate.core.fields): a
# trial's attributes, a run's tags and params, its JSON artifacts. A field not listed is read as text
# (tags, params) or as a number (metrics); a listed one that is absent is read as absent, as before.
TRIAL_ATTRS = {"plan": fields.JSON_OBJECT, "mlflow_run_id": fields.TEXT, "failure_reason": fields.TEXT}
PLAN = {"variant": fields.TEXT, "size": fields.TEXT, "seed": fields.INTEGER}
TAGS = {
    **dict.fromkeys(
        (names.TOKENS, names.SEED, names.PARAMS, names.NON_EMBEDDING_PARAMS, names.HEADS, names.HEAD_WIDTH,
         names.TRIAL, names.BUDGET_STEPS, names.BUDGET_TOKENS, names.BRANCH_STEP, names.CONTINUED_STEP),
        fields.INTEGER_TEXT,
    ),
    **dict.fromkeys(
        (names.TRAIN_SPLIT_TOKENS, names.PASSES, names.FWD_FLOPS_PER_TOKEN, names.FIT_PREDICTED_GAIN),
        fields.NUMBER_TEXT,
    ),
}  # fmt: skip
PARAMS = {
    **dict.fromkeys(("train.lr", "train.cooldown_fraction"), fields.NUMBER_TEXT),
    **dict.fromkeys(("train.warmup_steps", "train.batch_tokens", "train.steps"), fields.INTEGER_TEXT),
}
JSON_ARTIFACTS = ("data.json", "final_metrics.json")
METRIC_COLUMNS = {"run_id": "string", "key": "string", "step": "integer", "value": "floating"}  # pyarrow's
KIND_WORDS = {"string": "text", "integer": "integers", "floating": "floating-point numbers"}


def _check_trial_attrs(attrs: dict[str, Any], where: str, prefix: str) -> None:
    """A trial's attributes a report reads (`TRIAL_ATTRS`, the plan's own fields `PLAN`), each its kind."""
    for name, kind in TRIAL_ATTRS.items():
        if attrs.get(name) is not None:
            fields.field(where, prefix + name, attrs[name], kind, RESTORE)
    plan = fields.field(where, prefix + "plan", attrs.get("plan") or "{}", fields.JSON_OBJECT, RESTORE)
    for name, kind in PLAN.items():
        if name in plan:
            fields.field(where, f"{prefix}plan.{name}", plan[name], kind, RESTORE)
    for name, value in attrs.items():
        if name.startswith("budget_run:"):
            fields.field(where, prefix + name, value, fields.TEXT, RESTORE)


def _check_runs(runs: list[Any], where: Path) -> None:
    """Each row of runs.parquet, every field a report reads through its kind (ablate.core.fields): a run
    id, a status, its JSON columns each a mapping; tags and params text, the listed ones (`TAGS`,
    `PARAMS`) numbers as text; metrics numbers; artifacts text, the JSON ones objects, the recipe YAML."""
    import yaml

    from ablate.core.config import YamlTooLarge, load_yaml

    def bad(what: str) -> UserError:
        return UserError(f"--from: {where}: {what}; {RESTORE}")

    if len(runs) > MAX_TRIALS:
        raise bad(f"holds {len(runs):,} runs, more than {MAX_TRIALS:,}")
    for i, row in enumerate(runs):
        if not isinstance(row.get("run_id"), str) or not row["run_id"]:
            raise bad(f"row {i} has no run_id")
        if not isinstance(row.get("status"), str):
            raise bad(f"run {row['run_id']} has no status")
        run = f"--from: {where}: run {row['run_id']}"
        columns = {}
        for column in ("tags", "params", "metrics", "artifacts"):
            try:
                columns[column] = json.loads(row.get(column))
            except (TypeError, ValueError, RecursionError):
                columns[column] = None
            if not isinstance(columns[column], dict):
                raise bad(f"run {row['run_id']}'s {column} is not a JSON mapping")
        typed = {"tags": (TAGS, fields.TEXT), "params": (PARAMS, fields.TEXT), "metrics": ({}, fields.NUMBER)}
        typed["artifacts"] = ({}, fields.TEXT)
        for column, (kinds, kind) in typed.items():
            for name, value in columns[column].items():
                fields.field(run, f"{column}.{name}", value, kinds.get(name, kind), RESTORE)
        artifacts = columns["artifacts"]
        for name in JSON_ARTIFACTS:
            if name in artifacts:
                fields.field(run, f"artifacts.{name}", artifacts[name], fields.JSON_OBJECT, RESTORE)
        if "resolved_recipe.yaml" in artifacts:
            try:
                recipe = load_yaml(artifacts["resolved_recipe.yaml"])
            except (YamlTooLarge, yaml.YAMLError):
                recipe = None
            if not isinstance(recipe, dict):
                raise bad(f"run {row['run_id']}'s artifacts.resolved_recipe.yaml is not a YAML mapping")


def _check_metric_columns(path: Path) -> None:
    """metrics.parquet's columns (`METRIC_COLUMNS`) are there, each of its kind, before it is read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _parquet(path, pq.read_schema)
    for name, kind in METRIC_COLUMNS.items():
        if name not in schema.names:
            raise UserError(f"--from: {path} has no column {name!r} (of {KIND_WORDS[kind]}); {RESTORE}")
        column = schema.field(name).type
        column = column.value_type if pa.types.is_dictionary(column) else column
        if not getattr(pa.types, f"is_{kind}")(column):
            raise UserError(
                f"--from: {path}: column {name!r} holds {column}, not {KIND_WORDS[kind]}; {RESTORE}"
            )
