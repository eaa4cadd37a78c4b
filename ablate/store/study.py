"""A sweep's Optuna study, read and located: where it lives (storage), what it is called, how far it is.

The layer under `ablate.sweep` (which enqueues and trains) and beside `ablate.report.run_records`
and `ablate.report.fit_runs` (which only read a study and its finished MLflow runs): all three import this module,
so neither reader imports the sweep, and nothing here builds a model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.core.errors import UserError
from ablate.recipe.resolve import Recipe
from ablate.recipe.schema import RunSpec
from ablate.recipe.search import SearchSpec
from ablate.store import tracking
from ablate.store.stores import Stores


@dataclass
class SweepContext:
    """One sweep: a recipe at a scale, its seeds and search spec, and where its records live (`stores`).

    `runs` holds the run of every trial plan, resolved once when the context is made: one `resolve` per
    searched grid point (none for a plain grid, whose runs are the loaded recipe's). Enqueueing, the
    printed plan, every trial and the readers of finished runs (`ablate eval`, reports) look them up here.
    """

    recipe: Recipe
    scale: str
    seeds: list[int]
    stores: Stores
    search: SearchSpec = field(default_factory=SearchSpec)
    search_path: str | None = None
    grace_period: float = 60.0
    progress: bool = True
    runs: dict[str, RunSpec] = field(init=False, repr=False)  # plan key -> its run
    _plans: list[dict[str, Any]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        points = [(point, self._resolve_point(point)) for point in self.search.grid_points()]
        self.runs, self._plans = {}, []
        for i in range(len(points[0][1])):  # run by run (recipe order), each at every point
            for point, runs in points:
                for plan in self._plans_of(runs[i], point):
                    self.runs[plan_key(plan)] = runs[i]
                    self._plans.append(plan)

    @property
    def study_name(self) -> str:
        base = tracking.experiment_name(self.recipe.name, self.scale)
        return base if self.search.name == "grid" else f"{base}-{self.search.name}"

    def plans(self) -> list[dict[str, Any]]:
        """The fixed parameters of every trial the study must run, in recipe order."""
        return [dict(plan) for plan in self._plans]

    def run_for_plan(self, plan: dict[str, Any], sampled: dict[str, Any] | None = None) -> RunSpec:
        """The run of a trial: its plan's (resolved with the context), or, for a point a sampler drew
        (a search spec that is not a grid), the recipe resolved for that point now, once per trial."""
        point = {k: v for k, v in {**plan, **(sampled or {})}.items() if k.startswith("base.")}
        run = self.runs.get(plan_key({**plan, **point}))
        if run is not None:
            return run
        for run in self._resolve_point(point, seeds=[plan["seed"]]):
            if run.variant == plan["variant"] and run.size == plan.get("size"):
                return run
        raise UserError(
            f"--storage: a trial of study {self.study_name!r} names variant {plan['variant']!r}"
            f"{' size ' + repr(plan['size']) if plan.get('size') else ''}, which this recipe does not have at "
            f"scale {self.scale}; use the recipe the sweep was started with"
        )

    def recipe_key(self) -> str:
        """A hash of the runs' configs (recipe file, scale, overrides and search points; not the seeds,
        which trials carry): a worker started with another version of the recipe is refused."""
        keys = sorted({dataclasses.replace(run, seed=0).key for run in self.runs.values()})
        return hashlib.sha256(json.dumps(keys).encode()).hexdigest()[:16]

    def _resolve_point(self, point: dict[str, Any], seeds: list[int] | None = None) -> list[RunSpec]:
        """The runs at a searched point (its base.* values as overrides), for `seeds` (default: the sweep's)."""
        seeds = self.seeds if seeds is None else seeds
        overrides = [(k[len("base.") :], v) for k, v in point.items() if k.startswith("base.")]
        if not overrides and self.scale == self.recipe.scale:
            return self.recipe.runs_for(seeds)
        recipe = dataclasses.replace(self.recipe, base_overrides=self.recipe.base_overrides + overrides)
        return recipe.resolve(self.scale, seeds=seeds)

    def _plans_of(self, run: RunSpec, point: dict[str, Any]) -> list[dict[str, Any]]:
        fixed: dict[str, Any] = {"variant": run.variant, "seed": run.seed}
        if run.size:
            fixed["size"] = run.size
        repeats = self.search.trials_per_variant if self.search.sampler != "grid" else 1
        if repeats == 1:
            return [{**fixed, **point}]
        return [{**fixed, **point, "repeat": repeat} for repeat in range(repeats)]


def command_line() -> str:
    """This process's `ablate ...` command, as the user typed it (for reports' provenance)."""
    import sys

    from ablate.store.commands import command_text

    return command_text(sys.argv[1:]) if sys.argv and "ablate" in sys.argv[0] else "ablate sweep"


# The name of a study's sweep lock (ablate.sweep.lock), a study of its own in the same storage.
SWEEP_LOCK_SUFFIX = ":sweep-lock"


def open_study(ctx: SweepContext, create: bool = True):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = ctx.stores.storage()
    if not create:
        try:
            return optuna.load_study(
                study_name=ctx.study_name,
                storage=storage,
                sampler=ctx.search.make_sampler(),
                pruner=ctx.search.make_pruner(),
            ), storage
        except KeyError:
            raise UserError(
                f"--storage: no study {ctx.study_name!r} there; start it with `ablate sweep` first"
            ) from None
    study = optuna.create_study(
        study_name=ctx.study_name,
        storage=storage,
        load_if_exists=True,
        direction="minimize",
        sampler=ctx.search.make_sampler(),
        pruner=ctx.search.make_pruner(),
    )
    return study, storage


def plan_key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def trial_plan(trial: Any) -> dict[str, Any]:
    return json.loads(trial.user_attrs.get("plan", "{}"))


def is_settled(trial: Any) -> bool:
    """Done for good: complete, pruned, or failed by divergence (a retry would diverge again).
    A trial failed because its worker died or was interrupted is not: its retry is in the queue."""
    from optuna.trial import TrialState

    return trial.state in (TrialState.COMPLETE, TrialState.PRUNED) or (
        trial.state == TrialState.FAIL and trial.user_attrs.get("failure_reason", "").startswith("diverged")
    )


def completed_spans(trials: Any) -> list[tuple[Any, Any]]:
    """(start, end) datetimes of the completed trials among `trials`."""
    from optuna.trial import TrialState

    return [
        (t.datetime_start, t.datetime_complete)
        for t in trials
        if t.state == TrialState.COMPLETE and t.datetime_complete and t.datetime_start
    ]


def latest_trials(trials: Any) -> dict[str, Any]:
    """Plan key -> its latest trial (`trials` in trial-number order): a retry, or an extension of a budgeted
    study to larger budgets, stands for its plan."""
    latest: dict[str, Any] = {}
    for trial in trials:
        latest[trial.user_attrs.get("plan")] = trial
    return latest


def reported_trials(trials: Any) -> dict[str, Any]:
    """Plan key -> the trial a report shows: its latest, unless that one is still waiting, running or was
    handed back while an earlier trial of the plan completed; then the completed one. A budgeted study
    being extended reports the budgets it finished until the extension settles."""
    from optuna.trial import TrialState

    shown: dict[str, Any] = {}
    for trial in trials:
        key = trial.user_attrs.get("plan")
        earlier = shown.get(key)
        if earlier is not None and earlier.state == TrialState.COMPLETE and not is_settled(trial):
            continue
        shown[key] = trial
    return shown


def settled_plans(trials: Any) -> dict[str, Any]:
    """Plan key -> its trial, for the plans whose latest trial is settled (`is_settled`): while a later
    trial waits or runs, its plan is not done, however its earlier trials ended."""
    return {plan: t for plan, t in latest_trials(trials).items() if is_settled(t)}


def progress_counts(study: Any) -> tuple[int, int, list[float]]:
    """(finished plans, all plans, durations of finished trials in seconds)."""
    trials = study.get_trials(deepcopy=False)
    plans = {t.user_attrs.get("plan") for t in trials}
    finished = settled_plans(trials)
    durations = [(end - start).total_seconds() for start, end in completed_spans(trials)]
    return len(finished), len(plans), durations


def report_folder(ctx: SweepContext, reports: Path | None) -> Path:
    name = ctx.recipe.name if ctx.scale == "paper" else f"{ctx.recipe.name}-{ctx.scale}"
    if ctx.search.name != "grid":
        name += f"-{ctx.search.name}"
    return Path(reports or "reports") / name


def sweep_hint(ctx: SweepContext) -> str:
    """The command that would have made the study `ctx` names, for error messages."""
    stores = ctx.stores
    cmd = f"`ablate sweep {ctx.recipe.path} --scale {ctx.scale} --workspace {stores.workspace}"
    if stores.tracking_uri:
        cmd += f" --tracking-uri {stores.tracking_uri}"
    if stores.storage_url:
        cmd += f" --storage {stores.storage_url}"
    return cmd + "`"


def load_finished_study(ctx: SweepContext, verb: str):
    """The sweep's study for a verb that reads finished runs (`fit`, `eval`): never creates a workspace,
    a journal or a study; a missing one is a UserError naming the studies of this recipe that exist."""
    import optuna

    no_runs = f"{verb}: no finished runs of {ctx.recipe.name} at scale {ctx.scale}"
    workspace = ctx.stores.workspace
    if ctx.stores.storage_url is None and not workspace.journal.is_file():
        raise UserError(f"{no_runs}: no sweep in workspace {workspace}; run {sweep_hint(ctx)} first")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = ctx.stores.storage()
    names = [n for n in optuna.get_all_study_names(storage) if not n.endswith(SWEEP_LOCK_SUFFIX)]
    if ctx.study_name not in names:
        mine = sorted(n for n in names if n == ctx.recipe.name or n.startswith(ctx.recipe.name + "-"))
        there = f" (studies of this recipe there: {', '.join(mine)})" if mine else ""
        raise UserError(f"{no_runs}: no study {ctx.study_name!r}{there}; run {sweep_hint(ctx)} first")
    return optuna.load_study(study_name=ctx.study_name, storage=storage)


def finished_sweep(recipe: Recipe, scale: str, stores: Stores, verb: str) -> tuple[SweepContext, Any, Any]:
    """(context, study, MLflow client) of a sweep whose finished runs a verb reads (`fit`, `eval`); see
    load_finished_study; from a report folder's export when `stores` name one (ablate.store.export)."""
    ctx = SweepContext(recipe=recipe, scale=scale, seeds=recipe.seeds, stores=stores, progress=False)
    if stores.from_export:
        from ablate.store.export import exported_study

        return ctx, exported_study(stores.export_folder), stores.client()
    return ctx, load_finished_study(ctx, verb), stores.client()
