"""Scaling laws fitted to a sweep's finished runs and written as its fit folder: which law (the `form`) suits
the runs, the grid fit for sizes x token budgets (ablate.report.fit_runs reads and fits the runs;
ablate.report.scaling writes a grid's folder), and a grid fit's folder written again from its export alone.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate.core.errors import UserError

if TYPE_CHECKING:
    from ablate.store.study import SweepContext


def run_fit_recipe(
    recipe: Any,
    stores: Any,
    *,
    scale: str,
    form: str | None = None,
    out: Path | None = None,
    n_boot: int = 1000,
    params_count: str = "non_embedding",
    seed: int = 0,
    compare_with: str | None = None,
) -> list[Path]:
    """Fit the finished runs of `recipe`'s sweep at `scale`; returns the files written (the forms, the
    files and fit.json's keys: ablate.report.fit_runs); `compare_with`: ablate.report.grid_compare."""
    from ablate.report.fit_runs import FORMS, PARAMS_TAGS, finished_runs_of, fit_grid, fit_source
    from ablate.report.run_records import collect
    from ablate.report.scaling import is_grid
    from ablate.store.study import finished_sweep

    if params_count not in PARAMS_TAGS:
        raise UserError(f"--params-count: {params_count!r} is not one of {', '.join(PARAMS_TAGS)}")
    if form is not None and form not in FORMS:
        raise UserError(f"--form: {form!r} is not one of {', '.join(FORMS)}")
    if n_boot < 0:
        raise UserError(f"--bootstrap: expected a number >= 0, got {n_boot}")
    if compare_with is not None:
        from ablate.report.grid_compare import checked_folder

        compare_with = checked_folder(compare_with, form)
    ctx, study, client = finished_sweep(recipe, scale, stores, "fit")
    budgeted = recipe.budgets(scale) is not None  # every budget a run of its own (ablate.train.branches)
    records = collect(ctx, study, with_curves=True, budgets=budgeted)
    runs = finished_runs_of(ctx, client, records, params_count)
    archs = list(dict.fromkeys(r.arch for r in runs))
    sizes = list(dict.fromkeys(r.size for r in runs))
    if form == "grid" and not is_grid(runs, budgeted):
        raise UserError(
            f"--form grid: needs several sizes and token budgets; {recipe.name} at scale {scale} has "
            f"{len(sizes)} size(s){'' if budgeted else ' and no budgets'}; use --form size, tokens or joint"
        )
    if form in (None, "grid") and is_grid(runs, budgeted):
        reference = "transformer" if "transformer" in archs else archs[0]
        settings = {"form": "grid", "bootstrap": n_boot, "seed": seed, "params_count": params_count}
        settings |= {"compare_with": compare_with} if compare_with else {}  # for `ablate fit --from`
        return fit_grid(ctx, study, client, runs, records, reference, out, settings)
    if compare_with is not None:
        raise UserError(f"--compare-with: compares two grid fits; {recipe.name} at scale {scale} is not one")
    form = form or ("size" if len(sizes) > 1 else "tokens")
    if form == "tokens" and len(sizes) > 1:
        raise UserError(
            f"--form tokens: the runs have {len(sizes)} sizes ({', '.join(sizes)}); L(D) needs one "
            "size; use --form size (final losses) or --form joint (every validation)"
        )
    report, points = _fit_form(
        ctx, runs, records, form, budgeted, n_boot=n_boot, seed=seed, params_count=params_count
    )
    report.extra = fit_source(ctx, stores, runs, records, points, params_count)
    return _write_fit(ctx, study, client, runs, report, out, params_count, len(points))


def _fit_form(
    ctx: SweepContext,
    runs: list,
    records: list,
    form: str,
    budgeted: bool,
    *,
    n_boot: int,
    seed: int,
    params_count: str,
) -> tuple[Any, list]:
    """One law fitted over the runs' points, with each run's own loss curve and the notes."""
    from ablate.fitting import fit_points
    from ablate.report.fit_runs import count_by, fit_curve, fit_notes, points_of

    archs = list(dict.fromkeys(r.arch for r in runs))
    points = points_of(runs, form, budgeted)
    reference = ("transformer" if "transformer" in archs else archs[0]) if len(archs) >= 2 else None
    single = sorted(a for a, n in count_by(r.arch for r in runs).items() if n < 2)
    # One run per arch: every bootstrap draw over runs is that run, so percentile "intervals" would have
    # zero width. Give no intervals rather than false certainty.
    report = fit_points(points, form, n_boot=0 if single else n_boot, seed=seed, reference=reference)
    for run in runs:
        fit_curve(run)
    left_out = [r for r in records if not (r.state == "finished" and r.run_id)]
    report.notes = fit_notes(ctx, form, runs, points, left_out, params_count, budgeted)
    if budgeted:  # a family's points are runs at their own budgets, not checkpoints inside one run
        for fit in report.archs.values():
            fit.notes = [n for n in fit.notes if "a checkpoint inside a run" not in n]
    if single and n_boot:
        report.notes.append(
            f"No intervals: {', '.join(single)} {'has' if len(single) == 1 else 'have'} one run, "
            "and the bootstrap resamples runs (a run's validations are not independent); "
            "sweep more seeds (--seeds 0 1 2) for intervals."
        )
    return report, points


def _write_fit(
    ctx: SweepContext,
    study: Any,
    client: Any,
    runs: list,
    report: Any,
    out: Path | None,
    params_count: str,
    n_points: int,
) -> list[Path]:
    """fit.json, fit.md (with the runs' table) and the plots; recorded in MLflow; the summary printed."""
    from ablate.report.fit import arch_summary, ratio_sentence, write_fit
    from ablate.report.fit_runs import PARAMS_WORDS, record_in_mlflow, runs_markdown
    from ablate.report.folder import moved, writing
    from ablate.store.study import report_folder

    folder = Path(out) if out is not None else report_folder(ctx, None)
    splits = {r.split_tokens for r in runs if math.isfinite(r.split_tokens)}
    with writing(folder, "--out") as into:  # the folder as a whole, no link followed (ablate.report.folder)
        split = splits.pop() if len(splits) == 1 else math.nan
        written = write_fit(report, into, split, [r.sampling for r in runs])
        with open(into / "fit.md", "a") as f:
            f.write("\n" + runs_markdown(runs, params_count))
    written = moved(written, into, folder)
    record_in_mlflow(client, study, runs, report, written)
    print(
        f"[fit] {ctx.study_name}: {report.form.formula}, {n_points} points from {len(runs)} runs "
        f"(N = {PARAMS_WORDS[params_count]})",
        flush=True,
    )
    for fit in report.archs.values():
        print(f"[fit]   {arch_summary(fit)}", flush=True)
    for ratio in report.ratios:
        print(f"[fit]   {ratio_sentence(ratio)}", flush=True)
    not_converged = [r.name for r in runs if r.converged is False]
    if not_converged:
        print(
            f"[fit]   not converged ({len(not_converged)} of {len(runs)} runs): {', '.join(not_converged)}",
            flush=True,
        )
    return written


def rebuild_fit(folder: Path) -> list[Path]:
    """`ablate fit --from FOLDER`: write a grid fit's folder again from its export alone (no store, no
    training), with the recipe file the export names, read from this checkout, and the fit's own options."""
    from ablate.report.write import exported_recipe
    from ablate.store.export import SCHEME, reading
    from ablate.store.stores import Stores

    with reading(folder) as settings:  # the export and every file it names, as data
        if "fit" not in settings:
            raise UserError(
                f"ablate fit --from: {folder}'s export was written by a sweep's report, not by `ablate fit`; "
                f"use ablate report --from {folder}"
            )
        recipe = exported_recipe(settings)
        fit = settings["fit"]
        return run_fit_recipe(
            recipe,
            Stores(folder, tracking_uri=SCHEME + str(folder)),
            scale=recipe.scale,
            form=fit["form"],
            out=Path(folder),
            n_boot=fit["bootstrap"],
            params_count=fit["params_count"],
            seed=fit["seed"],
            compare_with=fit.get("compare_with"),
        )
