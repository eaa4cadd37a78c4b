"""`ablate sweep`: every run of a recipe at a scale as one Optuna study: check, plan, enqueue, train (through
the recipe's launcher: ablate.sweep.launchers), then report.

The sweep library below knows the queue, the workers and the launchers; this verb adds what a sweep does
around them: the plan it prints and the questions it asks (ablate.sweep.estimate,
ablate.recipe.data_use), the probes run as each trial ends (`eval.after_trial`, handed to the workers as a
callback) and the report written when every trial is settled.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate.core.argv import override_argv
from ablate.core.errors import UserError
from ablate.core.tables import format_seconds, si
from ablate.verbs.options import (
    Shared,
    launcher_start,
    print_ui_link,
    shared,
    sweep_context,
)

if TYPE_CHECKING:
    from ablate.store.study import SweepContext


@shared("scale", "seeds", "workspace", "tracking_uri", "storage", "reports")
def sweep(
    recipe: str,
    workers: int = 1,
    search: str | None = None,
    yes: bool = False,
    allow_unmatched: bool = False,
    no_train: bool = False,
    grace_period: float = 60.0,
    final: bool = False,
    launcher: str | None = None,
    wait: bool = False,
    *,
    overrides: list | None = None,
    **options: Any,
) -> int:
    """Train every variant x seed of a recipe as one Optuna study, then report.

    Args:
        recipe: recipe YAML file, e.g. recipes/table6.yaml
        workers: local worker processes (1: this one)
        search: search spec, e.g. sweeps/lr.yaml (default: the plain grid)
        yes: start without asking even if estimated over an hour
        allow_unmatched: train variants beyond the FLOPs tolerance
        no_train: only enqueue the trials and create the MLflow parent run; `ablate worker`s train them
        grace_period: seconds without heartbeat after which a trial's worker counts as dead
        final: the study is final: delete the stable-phase checkpoints kept to extend its budgets
        launcher: where the workers run: local (this machine) or slurm (a job array of --workers tasks;
            options in the recipe's launcher.slurm, e.g. --launcher.slurm.partition gpu); default: the recipe's
        wait: with --launcher slurm, wait for the jobs (printing progress), then report
    """
    from ablate.sweep.extend import keep_or_prune_stable, refuse_final_while_busy
    from ablate.verbs.check import run_check

    opts = Shared(**options)
    ctx = sweep_context(recipe, opts, search, grace_period, overrides)
    if final:
        refuse_final_while_busy(ctx)
    if workers < 1:
        raise UserError(f"--workers: expected a positive number, got {workers}")
    start = launcher_start(
        ctx, launcher, workers, wait=wait, overrides=overrides, after_trial=after_trial(ctx)
    )
    checked = run_check(ctx.recipe, ctx.scale, allow_unmatched=allow_unmatched)
    print(
        checked.split("\n\n", 1)[-1]
    )  # the check's notes: how FLOPs were counted, solved knobs, differences
    local = (launcher or ctx.recipe.file.launcher.name) == "local"
    folder = run_sweep(
        ctx,
        start=None if no_train and local else start,
        yes=yes,
        reports=Path(opts.reports),
        overrides_argv=override_argv(overrides or []),
    )
    if folder is not None:
        if ctx.recipe.budgets(ctx.scale) is not None:
            keep_or_prune_stable(ctx, final)
        print(f"report: {folder}/table.md (and table.csv, loss_curves.png)")
        print_ui_link(ctx, opts)
    return 0


def after_trial(ctx: SweepContext) -> Any:
    """What a worker of this sweep does with each finished run: the recipe's probes, when its
    `eval.after_trial` says so (the same tags as `ablate eval`, which then skips the run); then the paired
    differences of the rows it settles, on the sweep's parent run (ablate.report.ui_differences)."""

    skipped: list[bool] = []

    def probe(run: Any, run_id: str) -> None:
        if ctx.recipe.eval(run.scale).after_trial:
            from ablate.probes.run import probe_after_trial

            probe_after_trial(ctx.recipe, run, run_id, ctx.stores)
        if importlib.util.find_spec("scipy") is None:  # an image that trains only (the device check's)
            if not skipped:
                print("[sweep] paired differences not logged (no scipy here): `ablate report` logs them")
                skipped.append(True)
            return
        from ablate.report.ui_differences import log_differences
        from ablate.store.study import open_study

        log_differences(ctx, open_study(ctx, create=False)[0], finished_run=run_id)

    return probe


def run_sweep(
    ctx: SweepContext,
    *,
    start: Any,
    yes: bool = False,
    reports: Path | None = None,
    overrides_argv: list[str] | None = None,
) -> Path | None:
    """Plan, enqueue, start the workers (`start(study, storage)`: ablate.sweep.launchers; None: enqueue only,
    for `ablate worker`s elsewhere), then report. Returns the report folder, or None while trials go on."""
    from ablate.store.study import open_study

    study, storage = open_study(ctx)
    with hold_sweep(ctx, storage, overrides_argv or []):
        return _run_sweep(ctx, study, storage, start=start, yes=yes, reports=reports)


def hold_sweep(ctx: SweepContext, storage: Any, overrides_argv: list[str] | None = None) -> Any:
    """The study's sweep lock (ablate.sweep.lock): one `ablate sweep` per study, another one refused in a
    line that gives the `ablate worker` command joining it (with the sweep's overrides, so it runs as
    printed)."""
    from ablate.store.commands import command_text
    from ablate.sweep.lock import SweepLock
    from ablate.sweep.worker import worker_argv

    join = f"`{command_text(worker_argv(ctx, overrides_argv or [])[0])}`"
    return SweepLock(storage, ctx.study_name, ctx.grace_period, join=join)


def _run_sweep(
    ctx: SweepContext, study: Any, storage: Any, *, start: Any, yes: bool, reports: Path | None
) -> Path | None:
    from ablate.store.study import command_line
    from ablate.sweep.extend import check_extension, enqueue_extensions
    from ablate.sweep.queue import enqueue_missing, pending_plans
    from ablate.sweep.worker import parent_run_id

    check_extension(ctx, study)
    plans = ctx.plans()
    pending = pending_plans(study, plans, ctx)
    if pending:
        confirm_plan(ctx, pending, yes)
        enqueue_missing(study, plans)
        enqueue_extensions(study, pending)
        study.set_user_attr("recipe_key", ctx.recipe_key())
        if not study.user_attrs.get("command"):  # the report names the command that made the study
            study.set_user_attr("command", command_line())
        parent_run_id(ctx, study)  # creates the MLflow store here, before workers would race to create it
        if start is None:
            print(
                f"[sweep {ctx.study_name}] {len(pending)} trials enqueued; start `ablate worker` processes "
                "on the training machines, then `ablate report`",
                flush=True,
            )
            return None
        if not start(study, storage):
            return None
    remaining = pending_plans(study, plans, ctx)
    if remaining:
        print(
            f"[sweep {ctx.study_name}] {len(remaining)} trials still running elsewhere; "
            "run `ablate report` with the same arguments when they finish",
            flush=True,
        )
        return None
    return write_sweep_report(ctx, study, reports, fresh=bool(pending))


def write_sweep_report(ctx: SweepContext, study: Any, reports: Path | None, *, fresh: bool) -> Path:
    """The study's report folder, written when this sweep trained something or it has none yet."""
    from ablate.store.study import report_folder

    folder = report_folder(ctx, reports)
    if fresh or not (folder / "table.md").exists():
        from ablate.report.write import write_report

        return write_report(ctx, study, folder)
    print(
        f"[sweep {ctx.study_name}] all {len(ctx.plans())} trials were already finished; nothing to do",
        flush=True,
    )
    return folder


def confirm_plan(ctx: SweepContext, pending: list[dict[str, Any]], yes: bool) -> None:
    """Print the plan (trials, tokens, FLOPs, time from a calibration here; the passes over each corpus),
    ask before training past one pass (whatever `yes` says) and before anything over an hour."""
    from ablate.recipe.data_use import confirm_passes, data_uses
    from ablate.sweep.estimate import make_plan

    runs = [ctx.run_for_plan(p) for p in pending]
    plan = make_plan(runs, ctx.stores.workspace)
    print(
        f"[sweep {ctx.study_name}] plan: {plan.trials} trials, {si(plan.tokens)} tokens, "
        f"{si(plan.train_flops)}FLOP of training; calibrated {si(plan.flops_per_s)}FLOP/s here in "
        f"{plan.precision} ({plan.precision_reason}) "
        f"-> about {format_seconds(plan.seconds)} on one worker",
        flush=True,
    )
    uses = data_uses(runs, ctx.stores.workspace)
    for use in uses:
        print(f"[sweep {ctx.study_name}] {use.line()}", flush=True)
    confirm_passes(uses)  # asked whatever --yes says: repeating the corpus changes the experiment
    if plan.seconds > 3600 and not yes:
        if not sys.stdin or not sys.stdin.isatty():
            raise UserError(
                f"--yes: the sweep is estimated at {format_seconds(plan.seconds)} (over an hour); "
                "pass --yes to start it, or a smaller --scale (e.g. tiny)"
            )
        answer = input(f"Estimated {format_seconds(plan.seconds)}. Start? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            raise UserError("--yes: not confirmed; nothing was started")
