"""Scaling laws fitted to the finished runs of a recipe's sweep: reading them, their points and notes (`ablate fit`).

Where the runs come from: the sweep's Optuna study (`<recipe>[-<scale>]`, one record per planned run, a
retry replacing the attempt it retries) and each trial's MLflow run (its tags and validation curve),
through `report.collect`, as `ablate report` reads them. Only FINISHED runs count; the others are listed
in the notes. Both arms are counted the same way:

- N (params): the MLflow tag `ablate.non_embedding_params` (Kaplan et al.), or `ablate.params` with
  `params_count="total"`; both are written by `train` from the same parameter count.
- D (tokens): the `tokens` metric logged with each validation (optimizer steps x batch tokens).
- L: `val/loss` at that validation.

Form: `size` (one point per run, its final validation) when the grid has several sizes; `tokens` (one
point per validation after warmup of each run: Figure 3b) when it has one size; `joint` (every validation
of every size) only when asked. A checkpoint inside a run is not a separate run at that token budget
(the learning rate decays to the run's own end); the output says so and the bootstrap resamples runs.
A study with token budgets (ablate.recipe.budgets) has such runs: there `tokens` takes one point per
budget's run (its final validation), and the bootstrap resamples a seed's budgets together.

Per run, `fit_loss_curve` fits `E + A t^-alpha` to its validations after warmup and flags the run as not
converged when twice the tokens would still lower the loss by 1% or more: the table "Runs" at the end of
fit.md, and the tags `ablate.fit.converged` (yes | no | unknown), `ablate.fit.predicted_gain` on each run.

A size x budget grid (several sizes, and budgets) is fitted by ablate.report.scaling: the joint form and
the per-axis forms at the largest budget and size, ratios with paired seed intervals, and a README
(`--form grid`, the default there).

Written into `out` (default `reports/<recipe>[-<scale>]/`), and logged under `fit/` to the sweep's MLflow
parent run: fit.json, fit.md, loss_vs_params.png and/or loss_vs_tokens.png.

fit.json keys: `form`, `formula`, `level`, `n_boot`, `seed`, `reference` (the arch ratios are taken
against, or null), `archs` (per arch: `params` {E, A, alpha | B, beta}, `ci` (same keys, [lo, hi]),
`n_points`, `n_runs`, `ranges`, `objective`, `converged`, `n_boot`, `n_redrawn`, `notes`), `ratios` (per
trained value of each other arch: `reference`, `arch`, `quantity`, `at`, `fixed`, `target_loss`,
`matched`, `ratio`, `ci`, `status`, `n_boot`, `n_boot_no_solution`, `sentence`), `method`, `notes`, and
from here: `source` (recipe, scale, study, workspace, params_count, points, runs_finished,
runs_left_out) and `runs` (per finished run: `run_id`, `name`, `arch`, `size`, `seed`, `params`,
`tokens`, `loss`, `curve` {E, A, alpha, n_points, predicted_gain} or null, `converged` (true, false or
null when the curve could not be fitted), `curve_error`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate.core.errors import UserError
from ablate.core.tables import markdown_table, si
from ablate.data.passes import EARLIER_SAMPLING, REPEAT_EFFECT, sampling_of
from ablate.report.folder import moved, writing
from ablate.store import names, tracking

if TYPE_CHECKING:
    from ablate.store.study import SweepContext

PARAMS_TAGS = {"non_embedding": names.NON_EMBEDDING_PARAMS, "total": names.PARAMS}
PARAMS_WORDS = {"non_embedding": "non-embedding parameters", "total": "all parameters (embeddings included)"}
FORMS = ("size", "tokens", "joint", "grid")
CHECKPOINT_NOTE = (
    "Points are the validations of each run after warmup. A checkpoint inside one run is not a separate run "
    "at that token budget: the run's learning rate decays to the run's own end, so a run trained to that "
    "budget would do better; the bootstrap resamples whole runs."
)

BRANCH_NOTE = (
    "Each point is one run's final validation loss at its own token budget: the largest budget's runs "
    "trained from step 0 under warmup-stable-decay, each smaller budget cooled down from its branch point "
    "(ablate.train.branches), so every point is a run trained to that budget; the bootstrap resamples a "
    "seed's budgets together (they share the stable phase)."
)


@dataclass
class FinishedRun:
    run_id: str
    name: str
    arch: str
    size: str
    seed: int
    params: float  # N as asked (non-embedding or total)
    curve: list[tuple[float, float]]  # (tokens, val loss), validation order
    warmup_tokens: float
    loss: float  # final validation loss
    tokens: float  # tokens at the final validation
    curve_fit: Any = None  # LossCurveFit, or None when it could not be fitted
    curve_error: str = ""
    family: str = ""  # the training it belongs to: a budget's branch counts as its longest run's
    split_tokens: float = math.nan  # the training split it drew from (ablate.data.passes)
    passes: float = math.nan  # passes over that split
    sampling: str = EARLIER_SAMPLING  # how it drew its windows (data.sampling; ablate.data.passes)

    @property
    def converged(self) -> bool | None:
        return None if self.curve_fit is None else bool(self.curve_fit.converged)


def fit_grid(
    ctx: SweepContext,
    study: Any,
    client: Any,
    runs: list[FinishedRun],
    records: list,
    reference: str,
    out: Path | None,
    settings: dict[str, Any],
) -> list[Path]:
    """`ablate fit` over a size x budget grid (ablate.report.scaling); `settings`: the fit's options
    (form, bootstrap, seed, params_count), kept in the folder's export for `ablate fit --from`."""
    params_count = settings["params_count"]
    from ablate.report.fit import ratio_sentence
    from ablate.report.scaling import check_grid
    from ablate.store.study import report_folder

    check_grid(runs)
    fitted_ids = {run.run_id for run in runs}
    fitted = [r for r in records if r.run_id in fitted_ids]
    left_out = [r for r in records if not (r.state == "finished" and r.run_id)]
    notes = fit_notes(ctx, "joint", runs, runs, left_out, params_count, budgeted=True)[:1]
    notes.append(
        "Each point is one run's final validation loss at its own token budget (the largest budget trained "
        "from step 0 under warmup-stable-decay, each smaller budget cooled down from its branch point); "
        "intervals resample seeds, the same seeds for both arms."
    )
    folder = Path(out) if out is not None else report_folder(ctx, None)
    # the folder as a whole, its export too (ablate.report.folder)
    with writing(folder, "ablate fit") as into:
        written, fits, conv = _write_grid(ctx, study, client, runs, fitted, reference, into, settings, notes)
    written = moved(written, into, folder)
    if not ctx.stores.writes_records:  # `ablate fit --from`: the files again, nothing recorded anywhere
        return written
    for r in runs:
        c = conv[r.run_id]
        client.set_tag(
            r.run_id, names.FIT_CONVERGED, {True: "yes", False: "no", None: "unknown"}[c["converged"]]
        )
        if math.isfinite(c["gain_2x_tokens"]):
            client.set_tag(r.run_id, names.FIT_PREDICTED_GAIN, f"{c['gain_2x_tokens']:.5f}")
    parent = study.user_attrs.get(names.PARENT_RUN_ATTR)
    if parent:
        tracking.log_files(client, parent, [p for p in written if p.parent == folder], artifact_path="fit")
        client.set_tag(parent, names.FIT_FORM, "grid")
    print(f"[fit] {ctx.study_name}: a size x budget grid, {len(runs)} runs; {folder}", flush=True)
    for name, report in fits.items():
        for ratio in report.ratios:
            print(f"[fit]   {name}: {ratio_sentence(ratio)}", flush=True)
    return written


def _write_grid(ctx, study, client, runs, fitted, reference, into: Path, settings, notes):
    """The grid fit's files into `into` (write_grid_report), and its export unless it was read from one."""
    from ablate.report.budget_cost import train_seconds
    from ablate.report.provenance import FILE as PROVENANCE
    from ablate.report.provenance import provenance_row
    from ablate.report.scaling import write_grid_report
    from ablate.report.table import precisions, write_csv
    from ablate.report.write import export_settings
    from ablate.store.export_write import write_export
    from ablate.store.study import completed_spans

    written, fits, conv = write_grid_report(
        ctx,
        runs,
        reference,
        into,
        spans=completed_spans(study.get_trials(deepcopy=False)),
        seconds=train_seconds(ctx, fitted),
        n_boot=settings["bootstrap"],
        seed=settings["seed"],
        params_word=PARAMS_WORDS[settings["params_count"]],
        notes=notes,
        precision=precisions(fitted),
        machines=[r.tags.get(names.MACHINE, "") for r in fitted],
        data=data_note(runs),
        compare_with=settings.get("compare_with"),
    )
    when = provenance_row(ctx.study_name, study, fitted)  # the date, wall-clock, machine as a CSV row
    written.append(write_csv(into / PROVENANCE, [when]))
    if not ctx.stores.from_export:
        write_export(client, study, {**export_settings(ctx), "fit": settings}, into)
    return written, fits, conv


# --- reading -------------------------------------------------------------------------------------------
def finished_run(client: Any, record: Any, params_count: str) -> FinishedRun:
    tag = PARAMS_TAGS[params_count]
    name = record.tags.get("mlflow.runName") or f"{record.variant}-{record.size}-s{record.seed}"
    try:
        params = float(record.tags[tag])
    except (KeyError, ValueError):
        raise UserError(
            f"fit: run {name} ({record.run_id}) has no tag {tag}; it was trained by an older ablate; "
            "re-run it (delete the run in MLflow, then sweep again)"
        ) from None
    curve = [(float(t), float(v)) for t, v in record.curve if math.isfinite(v)]
    if not curve:
        raise UserError(
            f"fit: run {name} ({record.run_id}) is FINISHED but logged no finite val/loss; "
            "it cannot be fitted (delete the run in MLflow, then sweep again)"
        )
    run_params = client.get_run(record.run_id).data.params
    try:
        warmup = float(run_params["train.warmup_steps"]) * float(run_params["train.batch_tokens"])
    except (KeyError, ValueError):
        warmup = 0.0
    last_tokens, last_loss = curve[-1]
    return FinishedRun(
        run_id=record.run_id,
        name=name,
        arch=record.variant,
        size=record.size or "",
        seed=record.seed,
        params=params,
        curve=curve,
        warmup_tokens=warmup,
        loss=last_loss,
        tokens=last_tokens,
        family=record.branched_from or record.run_id,
        split_tokens=record.split_tokens,
        passes=record.passes,
        sampling=sampling_of(run_params),
    )


def finished_runs_of(ctx: SweepContext, client: Any, records: list, params_count: str) -> list[Any]:
    """The finished runs to fit, in the recipe's row order; one line when none, or one arch only."""
    from ablate.store.study import sweep_hint

    finished = [r for r in records if r.state == "finished" and r.run_id]
    if not finished:
        states = ", ".join(f"{n} {s}" for s, n in count_by(r.state for r in records).items()) or "no trials"
        raise UserError(
            f"fit: no finished runs of {ctx.recipe.name} at scale {ctx.scale} (study {ctx.study_name!r}: "
            f"{states}); run {sweep_hint(ctx)} first"
        )
    order = list(ctx.recipe.variants)
    runs = [finished_run(client, r, params_count) for r in finished]
    runs.sort(key=lambda r: (order.index(r.arch) if r.arch in order else len(order), r.params, r.seed))
    archs = list(dict.fromkeys(r.arch for r in runs))
    if len(order) >= 2 and len(archs) < 2:
        missing = [v for v in order if v not in archs]
        raise UserError(
            f"fit: an equal-loss ratio needs two architectures, but only {archs[0]!r} has finished "
            f"runs ({', '.join(missing)}: none); finish the sweep with {sweep_hint(ctx)}"
        )
    return runs


def fit_source(
    ctx: SweepContext, stores: Any, runs: list, records: list, points: list, params_count: str
) -> dict:
    """fit.json's `source` and `runs`: where the points came from."""
    left_out = [r for r in records if not (r.state == "finished" and r.run_id)]
    return {
        "source": {
            "recipe": ctx.recipe.name,
            "recipe_path": str(ctx.recipe.path),
            "scale": ctx.scale,
            "study": ctx.study_name,
            "workspace": str(stores.workspace),
            "params_count": params_count,
            "params_tag": PARAMS_TAGS[params_count],
            "points": len(points),
            "runs_finished": len(runs),
            "runs_left_out": [
                {"variant": r.variant, "size": r.size, "seed": r.seed, "state": r.state, "reason": r.reason}
                for r in left_out
            ],
        },
        "runs": [run_dict(r) for r in runs],
    }


def data_note(runs: list[FinishedRun]) -> str:
    """'Data: <split> training tokens; the runs make <passes> over them ...' ('' when not recorded)."""
    from ablate.report.checks import usage_summary

    text, repeated = usage_summary(runs)
    return f"Data: {text}." + (f" {REPEAT_EFFECT}" if repeated else "") if text else ""


def count_by(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


# --- points and per-run curves -----------------------------------------------------------------------------
def points_of(runs: list[FinishedRun], form: str, budgeted: bool = False) -> list:
    from ablate.fitting import Point

    if budgeted and form == "tokens":  # one point per budget's run; a seed's budgets resample together
        return [Point(r.arch, r.params, r.tokens, r.loss, r.family) for r in runs]
    if form == "size":
        return [Point(r.arch, r.params, r.tokens, r.loss, r.run_id) for r in runs]
    # tokens / joint: every validation after warmup (during warmup the curve is not a power law)
    return [Point(r.arch, r.params, t, v, r.run_id) for r in runs for t, v in r.curve if t > r.warmup_tokens]


def fit_curve(run: FinishedRun) -> None:
    from ablate.fitting import fit_loss_curve

    try:
        run.curve_fit = fit_loss_curve(
            [t for t, _ in run.curve], [v for _, v in run.curve], warmup_tokens=run.warmup_tokens
        )
    except UserError as e:
        run.curve_error = str(e)


def fit_notes(
    ctx: SweepContext,
    form: str,
    runs: list[FinishedRun],
    points: list,
    left_out: list,
    params_count: str,
    budgeted: bool = False,
) -> list[str]:
    notes = [
        f"Source: {len(runs)} finished runs of the sweep {ctx.study_name!r} (recipe {ctx.recipe.name}, "
        f"scale {ctx.scale}); N = {PARAMS_WORDS[params_count]} (MLflow tag {PARAMS_TAGS[params_count]}), "
        "the same count for every arch; D = training tokens at the validation."
    ]
    if data := data_note(runs):
        notes.append(data)
    if form == "size":
        budgets = sorted({r.tokens for r in runs})
        at = si(budgets[0]) if len(budgets) == 1 else f"{si(budgets[0])}-{si(budgets[-1])}"
        notes.append(f"Each point is one run's final validation loss, at D = {at} tokens.")
    elif budgeted and form == "tokens":
        notes.append(f"{BRANCH_NOTE} ({len(points)} points from {len(runs)} runs.)")
    else:
        notes.append(f"{CHECKPOINT_NOTE} ({len(points)} points from {len(runs)} runs.)")
    if left_out:
        notes.append(
            f"Left out, not finished ({len(left_out)}): "
            + "; ".join(
                f"{r.variant}{'@' + r.size if r.size else ''} seed {r.seed} {r.state}"
                + (f" ({r.reason})" if r.reason else "")
                for r in left_out
            )
            + "."
        )
    bad = [r for r in runs if r.converged is False]
    unknown = [r for r in runs if r.converged is None]
    if bad:
        notes.append(
            f"{len(bad)} of {len(runs)} runs had not converged (their fitted loss curve still falls by 1% "
            "or more with twice the tokens): the fit compares models before convergence; see Runs."
        )
    if unknown:
        notes.append(
            f"{len(unknown)} runs have too few validations after warmup for a loss-curve fit; see Runs."
        )
    return notes


def run_dict(r: FinishedRun) -> dict[str, Any]:
    c = r.curve_fit
    return {
        "run_id": r.run_id,
        "name": r.name,
        "arch": r.arch,
        "size": r.size,
        "seed": r.seed,
        "params": r.params,
        "tokens": r.tokens,
        "loss": r.loss,
        "curve": None
        if c is None
        else {
            "E": c.E,
            "A": c.A,
            "alpha": c.alpha,
            "n_points": c.n_points,
            "predicted_gain": c.predicted_gain,
        },
        "converged": r.converged,
        "curve_error": r.curve_error,
    }


def runs_markdown(runs: list[FinishedRun], params_count: str) -> str:
    """The per-run table appended to fit.md."""
    rows = []
    for r in runs:
        c = r.curve_fit
        curve = (
            ["-"] * 4
            if c is None
            else [f"{c.E:.3f}", f"{c.A:.3g}", f"{c.alpha:.3f}", f"{c.predicted_gain:.2%}"]
        )
        flag = {True: "yes", False: "**no**", None: "unknown"}[r.converged]
        rows.append(
            [r.name, r.arch, r.size or "-", r.seed, si(r.params), si(r.tokens), f"{r.loss:.4f}", *curve, flag]
        )
    headers = [
        "run",
        "arch",
        "size",
        "seed",
        "N",
        "D",
        "final val loss",
        "curve E",
        "curve A",
        "curve alpha",
        "gain at 2x tokens",
        "converged",
    ]
    table = markdown_table(headers, rows, align="lllrrrrrrrrl")
    unknown = [r for r in runs if r.curve_fit is None]
    foot = "".join(f"\n- {r.name}: {r.curve_error}" for r in unknown)
    return (
        f"## Runs\n\nPer run, `L(t) = E + A t^-alpha` fitted to its validations after warmup (t = tokens). "
        f'"converged": the fitted curve predicts less than 1% lower loss at twice the run\'s tokens. '
        f"N: {PARAMS_WORDS[params_count]}.\n\n{table}\n{foot}\n"
    )


# --- MLflow -----------------------------------------------------------------------------------------------
def record_in_mlflow(
    client: Any, study: Any, runs: list[FinishedRun], report: Any, written: list[Path]
) -> None:
    for r in runs:
        c = r.curve_fit
        client.set_tag(
            r.run_id, names.FIT_CONVERGED, {True: "yes", False: "no", None: "unknown"}[r.converged]
        )
        if c is not None:
            client.set_tag(r.run_id, names.FIT_PREDICTED_GAIN, f"{c.predicted_gain:.5f}")
            client.set_tag(r.run_id, names.FIT_CURVE, json.dumps({"E": c.E, "A": c.A, "alpha": c.alpha}))
    parent = study.user_attrs.get(names.PARENT_RUN_ATTR)
    if not parent:
        return
    tracking.log_files(client, parent, written, artifact_path="fit")
    metrics = {f"fit.{arch}.{k}": v for arch, f in report.archs.items() for k, v in f.params.items()}
    tracking.log_metrics(client, parent, metrics, step=0)
    client.set_tag(parent, names.FIT_FORM, report.form.name)
