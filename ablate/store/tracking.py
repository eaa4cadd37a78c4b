"""MLflow: where the store is, how runs are named and tagged, and how a run is found again.

- Store: embedded by default, SQLite at `<workspace>/mlflow.db` with artifacts under
  `<workspace>/artifacts`; `--tracking-uri` (e.g. http://host:5000) switches to a server (where it is and
  its client: ablate.store.stores).
- Experiment = recipe name (+ "-<scale>" unless the scale is `paper`), so scales never mix in one table.
- Run name = variant (-size) -s<seed>; tags: recipe, variant, scale, seed, size (if any), label, run key,
  code version.
- A run is found again by its run key (a hash of its resolved config): resuming never creates a
  second MLflow run for the same RunSpec unless the first one finished and `fresh` is asked for.

Why MLflow's client here and not Lightning's `MLFlowLogger`: that logger creates its run when training
starts, so it cannot find and resume the run of a RunSpec by its run key (a retried trial must log into
the same run), cannot make it a child of the sweep's parent run before training (it takes `run_id` or
tags, but then every search and nesting tag is ours to set anyway), and logs each metric call at once
(ours are batched: one `log_batch` per validation, which matters on a remote PostgreSQL store). It would
carry tags and artifacts, but the run's lifecycle (open or resume, FAILED on divergence, left RUNNING
when killed so the next attempt resumes it) would still be written here; so the client is used directly.
"""

from __future__ import annotations

import json
import math
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from ablate.core.workspace import Workspace
from ablate.store import names


def database_url(url: str) -> str:
    """A SQLAlchemy URL the installed driver can open: `postgresql://` means psycopg2 to SQLAlchemy, so it
    becomes `postgresql+psycopg://` when only psycopg 3 (the `postgres` extra) is installed."""
    import importlib.util

    if (
        url.startswith(("postgresql://", "postgres://"))
        and importlib.util.find_spec("psycopg2") is None
        and importlib.util.find_spec("psycopg") is not None
    ):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def experiment_name(recipe: str, scale: str) -> str:
    return recipe if scale == "paper" else f"{recipe}-{scale}"


# MLflow 3 opens an experiment on its GenAI overview unless its tag names.EXPERIMENT_KIND calls it a training
# experiment (the UI's kinds: genai_development, custom_model_development, ...; read by mlflow/server/js).
TRAINING_KIND = "custom_model_development"


def get_experiment_id(client, name: str, workspace: Workspace) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        mark_training_experiment(client, experiment)
        return experiment.experiment_id
    location = None
    if client.tracking_uri.startswith("sqlite:"):
        location = (workspace.create().artifacts / name).as_uri()
    try:
        return client.create_experiment(
            name, artifact_location=location, tags={names.EXPERIMENT_KIND: TRAINING_KIND}
        )
    except Exception:  # another worker created it first
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def mark_training_experiment(client, experiment) -> None:
    """Tag `experiment` as a training experiment unless it already says what kind it is (a user's choice
    in the UI wins); one request, only for experiments made before the tag existed."""
    if names.EXPERIMENT_KIND not in (experiment.tags or {}):
        client.set_experiment_tag(experiment.experiment_id, names.EXPERIMENT_KIND, TRAINING_KIND)


def runs_page_url(ui_url: str, experiment_id: str) -> str:
    """The MLflow UI's runs table of one experiment (the UI routes after '#')."""
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs"


# Generated outputs that are tracked (committed reports): rewriting them is not a change of the code.
GENERATED_PATHS = ("reports",)


def code_version(root: Path | None = None) -> str:
    """The git commit of the ablate checkout, with '+dirty' when a tracked file outside the generated
    outputs (`GENERATED_PATHS`) is modified; or the package version outside a git checkout.

    Untracked files (a virtual environment, a workspace, caches) never count: they are not the code, and
    a fresh clone with `python -m venv .venv` must record the commit it is at. Nor does a rewritten
    report: `ablate sweep` writes `reports/<recipe>-<scale>/` and would otherwise mark the next run dirty.
    """
    import ablate

    root = root or Path(ablate.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        excluded = [f":(top,exclude){path}" for path in GENERATED_PATHS]
        dirty = subprocess.run(
            [
                "git",
                "-C",
                str(root),
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ":(top)",
                *excluded,
            ],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return f"ablate-{ablate.__version__}"


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{'model': {'d_model': 8}} -> {'model.d_model': 8}; lists stay one value."""
    if isinstance(tree, dict) and tree:
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): tree}


def find_runs(client, experiment_id: str, run_key: str) -> list:
    return client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{names.RUN_KEY}` = '{run_key}'",
        order_by=["attributes.start_time DESC"],
    )


def run_tags(run, code: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    tags = {
        names.RECIPE: run.recipe,
        names.VARIANT: run.variant,
        names.LABEL: run.label,
        names.SCALE: run.scale,
        names.SEED: str(run.seed),
        names.RUN_KEY: run.key,
        names.CODE_VERSION: code,
        names.TORCH: _torch_version(),
    }
    if run.size:  # a recipe without sizes: no empty tag
        tags[names.SIZE] = run.size
    tags.update(extra or {})
    return tags


def _torch_version() -> str:
    """The installed torch's version, read from its package metadata (importing torch is not needed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "not installed"


def open_run(
    client,
    run,
    workspace: Workspace,
    *,
    parent_run_id: str | None = None,
    fresh: bool = False,
    extra_tags: dict[str, str] | None = None,
) -> tuple[str, str]:
    """The MLflow run for `run`: ('resumed'|'finished'|'new', run_id).

    An unfinished run with the same key (status RUNNING: its process died or was stopped) is resumed,
    so there is one MLflow run per RunSpec whatever the number of interruptions; a finished one is
    returned as 'finished' unless `fresh`. A FAILED or KILLED run stays as the record of that attempt.
    """
    experiment_id = get_experiment_id(client, experiment_name(run.recipe, run.scale), workspace)
    for existing in find_runs(client, experiment_id, run.key):
        status = existing.info.status
        if status == "FINISHED" and not fresh:
            return "finished", existing.info.run_id
        if status in ("RUNNING", "SCHEDULED") and not fresh:
            from mlflow.entities import RunTag

            client.update_run(existing.info.run_id, status="RUNNING")
            if extra_tags:  # one request, not one per tag (a tracking server is a round trip away)
                client.log_batch(
                    existing.info.run_id, tags=[RunTag(k, str(v)) for k, v in extra_tags.items()]
                )
            return "resumed", existing.info.run_id
    tags = run_tags(run, code_version(), extra_tags)
    if parent_run_id:
        tags[names.MLFLOW_PARENT] = parent_run_id
    created = client.create_run(experiment_id, run_name=run.name, tags=tags)
    run_id = created.info.run_id
    log_params(client, run_id, flatten(run.config))
    log_text(client, run_id, resolved_recipe_yaml(run), "resolved_recipe.yaml")
    return "new", run_id


def resolved_recipe_yaml(run) -> str:
    import yaml

    header = {
        "recipe": run.recipe,
        "variant": run.variant,
        "label": run.label,
        "scale": run.scale,
        "seed": run.seed,
        "size": run.size,
        "run_key": run.key,
    }
    return yaml.safe_dump({**header, **run.config}, sort_keys=False, allow_unicode=True)


def log_params(client, run_id: str, params: dict[str, Any]) -> None:
    from mlflow.entities import Param

    items = [Param(k[:250], json.dumps(v) if not isinstance(v, str) else v) for k, v in params.items()]
    for start in range(0, len(items), 100):
        client.log_batch(run_id, params=items[start : start + 100])


def set_tags(client, run_id: str, tags: dict[str, str], current: dict[str, str] | None = None) -> None:
    """Set the tags whose value differs from the run's (`current`: its tags, when already read).

    Through `log_batch`, not `set_tag`: MLflow's SQL store retries a batch whose tag another process
    inserted between its read and its write, while `set_tag` fails on that duplicate key; two workers that
    end trials at the same moment both write the sweep's parent run."""
    from mlflow.entities import RunTag

    if current is None:
        current = client.get_run(run_id).data.tags
    changed = [RunTag(key, value) for key, value in tags.items() if current.get(key) != value]
    if changed:
        client.log_batch(run_id, tags=changed)


def log_metrics(client, run_id: str, metrics: dict[str, float], step: int) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    items = [
        Metric(k, float(v), now, int(step)) for k, v in metrics.items() if v is not None and math.isfinite(v)
    ]
    if items:
        client.log_batch(run_id, metrics=items)


def log_text(client, run_id: str, text: str, name: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_text(text)
        client.log_artifact(run_id, str(path))


def log_json(client, run_id: str, data: dict[str, Any], name: str) -> None:
    """`data` as a strict JSON artifact: a NaN or infinity (a diverged loss) is written as null, which
    every JSON reader accepts, not as Python's `NaN`, which is not JSON."""
    log_text(client, run_id, json.dumps(_finite_or_none(data), indent=2, allow_nan=False), name)


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    return value


def log_files(client, run_id: str, paths: list[Path], artifact_path: str | None = None) -> None:
    for path in paths:
        client.log_artifact(run_id, str(path), artifact_path)


class ArtifactUnreadable(Exception):
    """A run's artifact that is there but cannot be read: the message names the run, the file and why."""


def first_line(error: BaseException) -> str:
    """`Type: the first line of the message`, for a line that names what failed."""
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:160]}"


def artifact_text(client, run_id: str, name: str) -> str | None:
    """The text of run `run_id`'s artifact `name`; None when the run has none (an unfinished run). One the
    store lists but cannot serve, or that is not text, raises ArtifactUnreadable naming the run and why."""
    from mlflow.exceptions import MlflowException

    with tempfile.TemporaryDirectory() as folder:
        try:
            if hasattr(client, "list_artifacts"):  # an export (ablate.store.export) lists none: it raises
                if name not in {f.path for f in client.list_artifacts(run_id)}:
                    return None
            return Path(client.download_artifacts(run_id, name, folder)).read_text()
        except FileNotFoundError:  # an export's run without it
            return None
        except (MlflowException, OSError, UnicodeDecodeError) as e:
            raise ArtifactUnreadable(f"run {run_id}: {name} not read ({first_line(e)})") from e


def read_json_artifact(client, run_id: str, name: str) -> dict[str, Any] | None:
    """A JSON artifact of a run (e.g. final_metrics.json), or None if it has none."""
    with tempfile.TemporaryDirectory() as folder:
        try:
            path = client.download_artifacts(run_id, name, folder)
        except Exception:  # no such artifact (an unfinished run), or the store cannot serve it
            return None
        return json.loads(Path(path).read_text())
