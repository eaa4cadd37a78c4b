"""What several verbs share: the `Shared` options (declared once: type, default, help), each verb's options
as `ablate.cli` hands them to jsonargparse, loading a recipe with the command line's overrides (and
printing it resolved: `--print_config`), a sweep's context, and the checks of a tracking URI.

A verb names the `Shared` options it takes with `@shared(...)` and reads them as `Shared(**options)`.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import re
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ablate.core.argv import Option, override_argv
from ablate.core.errors import UserError
from ablate.core.workspace import Workspace

if TYPE_CHECKING:
    from ablate.store.stores import Stores
    from ablate.store.study import SweepContext

DEFAULT_WORKSPACE = "ablate-runs"


@dataclasses.dataclass(frozen=True)
class Shared:
    """The options several verbs take, declared once (type, default, help); a verb names the ones it
    takes with `@shared(...)` and reads them as `Shared(**options)`.

    Attributes:
        scale: scale preset of the recipe (paper, small, tiny, ...; default: the recipe's default_scale)
        seeds: seeds (default: the recipe's seeds)
        workspace: folder for the embedded stores, checkpoints and caches
        tracking_uri: MLflow tracking URI (default: SQLite in the workspace)
        storage: Optuna storage: postgresql://... for many machines (default: a journal file in the workspace)
        reports: folder for reports
        search: search spec of the sweep, e.g. sweeps/lr.yaml (default: the plain grid)
        grace_period: seconds without heartbeat after which a trial's worker counts as dead
    """

    scale: str | None = None
    seeds: list[int] | None = None
    workspace: str = DEFAULT_WORKSPACE
    tracking_uri: str | None = None
    storage: str | None = None
    reports: str = "reports"
    search: str | None = None
    grace_period: float = 60.0

    @property
    def layout(self) -> Workspace:
        """The --workspace folder's layout (ablate.core.workspace)."""
        return Workspace(self.workspace)

    @property
    def stores(self) -> Stores:
        """Where the verb's records live: the workspace, `tracking_uri` (checked: one line when MLflow
        cannot use it) and `storage`."""
        from ablate.store.stores import Stores, passed_down

        tracking_uri, storage = passed_down(
            self.tracking_uri, self.storage
        )  # a parent's, through the environment
        return Stores(self.layout, tracking_uri_checked(tracking_uri), storage)


def shared(*names: str) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Mark a verb as taking these `Shared` options (as flags; the verb gets them in `**options`)."""
    unknown = set(names) - {f.name for f in dataclasses.fields(Shared)}
    assert not unknown, unknown  # a programming error, not a user's

    def mark(fn: Callable[..., int]) -> Callable[..., int]:
        fn.shared = names
        return fn

    return mark


def verb_options(fn: Callable[..., int]) -> list[Option]:
    """The verb's signature, the `Shared` options it takes, and the keyword-only arguments with defaults of
    the library function it names as `flags_from` ((module, name), read when asked), less its `internal`
    ones (the library's, not the command line's); help from the docstrings' `Args:`/`Attributes:`."""
    from ablate.core.config import field_docs

    docs, hints, params = field_docs(fn), typing.get_type_hints(fn), inspect.signature(fn).parameters
    options = [
        Option(n, hints[n], p.default, docs.get(n, ""))
        for n, p in params.items()
        if p.kind is p.POSITIONAL_OR_KEYWORD
    ]
    shared_docs, shared_hints = field_docs(Shared), typing.get_type_hints(Shared)
    options += [
        Option(f.name, shared_hints[f.name], f.default, shared_docs.get(f.name, ""), shared=True)
        for f in dataclasses.fields(Shared)
        if f.name in getattr(fn, "shared", ())
    ]
    if hasattr(fn, "flags_from"):
        module, name = fn.flags_from
        target = getattr(importlib.import_module(module), name)
        more, covered = typing.get_type_hints(target), set(params) | set(getattr(fn, "internal", ()))
        options += [
            Option(n, more.get(n, str), p.default, docs.get(n, ""))
            for n, p in inspect.signature(target).parameters.items()
            if p.kind is p.KEYWORD_ONLY and n not in covered and p.default is not p.empty
        ]
    return options


def load(path: str, overrides: list | None, scale: str | None = None) -> Any:
    """The recipe at `path`, with the command line's overrides, resolved at `scale`."""
    from ablate.recipe.loading import load_recipe

    return load_recipe(path, overrides or [], scale=scale)


def print_resolved(recipe: str | None, scale: str | None, overrides: list) -> None:
    """`--print_config`: the recipe resolved at `scale` with the overrides applied, as a recipe file."""
    import yaml

    from ablate.recipe.resolve import resolved_recipe

    if not recipe:
        raise UserError("--print_config: prints a recipe; give one")
    loaded = load(recipe, overrides, scale)
    print(
        f"# resolved by ablate from {loaded.path} at scale {loaded.scale}; "
        "`ablate check FILE` accepts this file as it is"
    )
    print(yaml.safe_dump(resolved_recipe(loaded, scale), sort_keys=False, allow_unicode=True), end="")


# What MLflow can track to: its server or a database it supports (MLflow 3 no longer opens a folder, a file
# store).
TRACKING_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks", "databricks-uc")


def tracking_uri_checked(uri: str | None) -> str | None:
    """`--tracking-uri`, refused in one line when MLflow cannot use it (ftp://..., a typo in the scheme, a
    folder: MLflow 3 refuses file stores). `export:FOLDER` (a report's runs, ablate.store.export) passes."""
    from ablate.store.export import SCHEME as EXPORT
    from ablate.store.sqlite_store import sqlite_url

    if uri is None or uri.startswith(EXPORT) or uri in ("databricks", "databricks-uc"):
        return uri
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", uri)
    base = scheme.group(1).split("+")[0].lower() if scheme else None
    if base == "file" or (not scheme and uri.strip()):
        folder = uri[len("file://") :] if base == "file" else uri
        raise UserError(
            f"--tracking-uri: {uri!r} is a folder (a file store), which MLflow 3 does not open; give "
            f"{sqlite_url(Workspace(folder).mlflow_db)} for a database in it, or leave --tracking-uri "
            "out for the workspace's own store"
        )
    if base not in TRACKING_SCHEMES:
        raise UserError(
            f"--tracking-uri: {uri!r} is not a tracking URI MLflow can use; give one of "
            f"{', '.join(s + '://' for s in TRACKING_SCHEMES)}"
        )
    return uri


def sweep_context(
    recipe: str, opts: Shared, search: str | None, grace_period: float, overrides: list | None
) -> Any:
    """The sweep of `recipe` at the options' scale, seeds and stores (ablate.store.study.SweepContext)."""
    from ablate.recipe.search import SearchSpec, load_search_spec
    from ablate.store.study import SweepContext

    grace_period_checked(grace_period)
    loaded = load(recipe, overrides, opts.scale)
    return SweepContext(
        recipe=loaded,
        scale=loaded.scale,
        seeds=opts.seeds or loaded.seeds,
        stores=opts.stores,
        search=load_search_spec(search) if search else SearchSpec(),
        search_path=search,
        grace_period=grace_period,
    )


# A worker's heartbeat can miss a beat or two (a slow storage, a long step holding the interpreter): the
# grace period is at least this many heartbeats, or busy workers would be taken for dead.
GRACE_HEARTBEATS = 3


def grace_period_checked(seconds: float) -> float:
    """`--grace-period`: a finite number of seconds, at least GRACE_HEARTBEATS heartbeats; else one line."""

    from ablate.sweep.queue import HEARTBEAT_SECONDS

    least = GRACE_HEARTBEATS * HEARTBEAT_SECONDS
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < least:
        raise UserError(
            f"--grace-period: {seconds!r} is not a number of seconds a worker may go without a heartbeat; "
            f"give a finite number of at least {least:g} ({GRACE_HEARTBEATS} heartbeats of "
            f"{HEARTBEAT_SECONDS:g} s)"
        )
    return float(seconds)


def launcher_start(
    ctx: SweepContext,
    name: str | None,
    workers: int,
    *,
    wait: bool,
    overrides: list | None,
    after_trial: Any = None,
) -> Callable[[Any, Any], bool]:
    """The launcher `name` (default: the recipe's `launcher.name`) checked now, before anything is enqueued;
    returns what starts its workers on a study (ablate.sweep.launchers)."""
    from ablate.sweep.launchers import launcher

    chosen = launcher(name or ctx.recipe.file.launcher.name, key="--launcher" if name else "launcher.name")
    return chosen.start(
        ctx, workers, overrides_argv=override_argv(overrides or []), wait=wait, after_trial=after_trial
    )


def print_ui_link(ctx: SweepContext, opts: Shared) -> None:
    """How to open the sweep's runs in the MLflow UI: the command, and the link to its comparison view."""
    import shlex

    from ablate.store.stores import sweep_runs_url

    # shell-quoted: the command runs as printed whatever the workspace's characters
    ui = "ablate ui" + (
        f" --workspace {shlex.quote(str(opts.workspace))}" if opts.workspace != DEFAULT_WORKSPACE else ""
    )
    uri = ctx.stores.tracking_uri or ""
    served = uri if uri.startswith("http") else "http://127.0.0.1:5000"
    url = sweep_runs_url(ctx.stores, ctx.recipe.name, ctx.scale, served) or served
    print(f"MLflow UI: {ui}  -> {url}")
