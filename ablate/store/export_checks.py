"""Every field of an export (ablate.store.export) checked before anything is built from it.

An export is data, never code: its report settings name only relative paths inside the checkout, plain
values and `base.*` overrides (`check_settings`); the YAML files they name are read as data first
(`check_is_data`); its study (`check_study`), its runs (`check_runs`) and its metric columns
(`check_metric_columns`) are read field by field, each through its kind (ablate.core.fields). A malformed,
oversized or crafted field is one line naming it, never a traceback, and never code run here.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from ablate.core import fields
from ablate.core.errors import UserError
from ablate.store import names

RESTORE = "restore the folder from git (git checkout -- FOLDER) or write the report again from its store"
CODE_KEYS = {"class_path", "init_args", "imports"}
MAX_BOOTSTRAP = 100_000  # resamples an export may ask for (the CLI's default is 1,000)
MAX_TRIALS = 100_000  # trials (and runs) an export may hold: a crafted one must not run for hours
STATES = ("RUNNING", "COMPLETE", "PRUNED", "FAIL", "WAITING")


def read_parquet(path: Path, read: Any) -> Any:
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


def check_is_data(path: Path, what: str) -> None:
    """A YAML file an export names (ablate.store.export.NAMED_FILES), read as data before it is loaded:
    one that lists `imports:` or names a `class_path` anywhere, as a key or a part of a dotted key (a
    search spec's `base.model.attention.class_path`), is one line naming the file and the key, whichever
    folder holds it."""
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


def check_runs(runs: list[Any], where: Path) -> None:
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


def check_metric_columns(path: Path) -> None:
    """metrics.parquet's columns (`METRIC_COLUMNS`) are there, each of its kind, before it is read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = read_parquet(path, pq.read_schema)
    for name, kind in METRIC_COLUMNS.items():
        if name not in schema.names:
            raise UserError(f"--from: {path} has no column {name!r} (of {KIND_WORDS[kind]}); {RESTORE}")
        column = schema.field(name).type
        column = column.value_type if pa.types.is_dictionary(column) else column
        if not getattr(pa.types, f"is_{kind}")(column):
            raise UserError(
                f"--from: {path}: column {name!r} holds {column}, not {KIND_WORDS[kind]}; {RESTORE}"
            )
