"""A finished sweep's report folder, every part of it, written and attached to MLflow (`ablate report`).

The runs come from `ablate.report.run_records`, the table from `ablate.report.table` and its checks
from `ablate.report.honesty`; the probe sections (`ablate.report.probes`), a task recipe's tables
(`ablate.report.tasks`) and a budgeted study's trend (`ablate.report.budgets`) are added when the runs
have them. This module is the one that knows all parts, so the parts need not know each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate.core.errors import UserError
from ablate.core.tables import markdown_table
from ablate.report import tasks as task_report
from ablate.report.checks import passes_columns
from ablate.report.claims import CHECKED, check_claims
from ablate.report.claims import FILE as CLAIMS
from ablate.report.folder import refuse_links, writing
from ablate.report.honesty import honesty_checks
from ablate.report.provenance import FILE as PROVENANCE
from ablate.report.provenance import date_line, provenance_row, wall_clock_line
from ablate.report.run_records import collect
from ablate.report.table import (
    add_convergence_columns,
    best_per_variant,
    comparisons_note,
    edge_warnings,
    paper_rows,
    plot_loss_curves,
    row_labels,
    summary_rows,
    table_rows,
    write_csv,
)
from ablate.store import names, tracking
from ablate.store.commands import portable_command
from ablate.store.export import METRICS_FILE, RUNS_FILE
from ablate.store.export_write import write_export

if TYPE_CHECKING:
    from ablate.store.study import SweepContext


def write_report(ctx: SweepContext, study: Any, folder: Path, compare_with: list[str] | None = None) -> Path:
    """Write the report folder as a whole (ablate.report.folder: a reader sees the old one or the new one),
    then attach it to the study's MLflow run; `compare_with`: report folders to set the runs beside
    (ablate.report.compare_runs)."""
    with writing(folder, "ablate report") as into:
        shown = _write_files(ctx, study, into, compare_with or [])
    if ctx.stores.writes_records:
        _attach(ctx, study, folder)
    print(f"[report] {folder / 'table.md'}\n\n" + shown, flush=True)
    return folder


def _write_files(ctx: SweepContext, study: Any, folder: Path, compare_with: list[str]) -> str:
    """Every file of the report into `folder`; returns what the verb prints below the table's path."""
    records = collect(ctx, study)
    all_records = records
    chosen: list[str] = []
    if any(r.searched for r in records):
        records, chosen = best_per_variant(records)
    warnings = edge_warnings(records, ctx.search)
    folder.mkdir(parents=True, exist_ok=True)
    honesty = honesty_checks(ctx, all_records, records)
    budget_records, family = _budget_family(ctx, study)
    headers, rows, _ = table_rows(ctx, records, marks=honesty.marks)
    csv_rows = table_rows(ctx, all_records)[2]  # every run of the study, every searched point
    shown = {r.run_id for r in records}
    for row in csv_rows:
        row["in_table"] = "yes" if row["mlflow_run_id"] in shown else "no"
    add_convergence_columns(csv_rows, honesty.convergence)
    passes_columns(csv_rows, all_records)
    table = markdown_table(headers, rows)
    title = f"# {ctx.recipe.name} at scale {ctx.scale}\n\n" + "\n\n".join(honesty.header)
    notes = _notes(ctx, records, headers, chosen, warnings, family) + honesty.notes
    sections, transfer = _sections(ctx, all_records, honesty, folder)
    summary = summary_rows(ctx, records, family)
    claims, claims_section = check_claims(folder, summary, honesty.sensitivity_rows or [])
    sections += claims_section
    (folder / "table.md").write_text(f"{title}\n\n{table}\n\n" + "\n\n".join(notes) + "\n" + sections)
    write_csv(folder / "table.csv", csv_rows)
    write_csv(folder / "summary.csv", summary)
    if claims:  # a prediction written before the runs, beside what they measured (ablate.report.claims)
        write_csv(folder / CHECKED, claims)
    if paper := paper_rows(ctx):
        write_csv(folder / "paper.csv", paper)
    when = provenance_row(ctx.study_name, study, all_records + budget_records)
    write_csv(folder / PROVENANCE, [when])
    plot_loss_curves(records, row_labels(ctx), folder / "loss_curves.png", list(ctx.recipe.variants))
    more = _other_reports(ctx, study, records, budget_records, folder, compare_with)
    if not ctx.stores.from_export:  # the runs behind each file above: `ablate report --from` rebuilds them
        settings = export_settings(ctx) | ({"compare_with": compare_with} if compare_with else {})
        write_export(ctx.stores.client(), study, settings, folder)
    files = (
        ", `loss_curves.png`"
        + (", `lr_sensitivity.md`, `lr_sensitivity.csv`" if honesty.sensitivity else "")
        + (
            ", `transfer.csv` (each row's best lr per size, and its move from the smallest)"
            if transfer
            else ""
        )
        + (", `layer_stats.csv` (the residual-stream table's cells)" if honesty.layers else "")
        + (
            f", `{CHECKED}` (the claims of `{CLAIMS}` measured; the README says when and where they were first "
            "written down, which is what puts them before the runs)"
            if claims
            else ""
        )
        + "".join(f", `{path.name}`" for path in more)
    )
    shown_runs = len(records) if chosen else 0
    header = _readme_header(ctx, study, all_records, budget_records, shown_runs, bool(paper), files, when)
    if carries_ui_series(ctx.stores.client(), all_records):
        header += ui_series_line(bool(budget_records))
    from ablate.report.folder import kept_text

    readme = folder / "README.md"  # written last: its header lists every file the report wrote
    kept = kept_text(readme, header)
    readme.write_text(header + (f"\n{kept}" if kept else ""))
    return (
        "\n".join(honesty.header)
        + f"\n\n{table}\n"
        + "".join(f"\n{n}" for n in honesty.notes)
        + (f"\n\n{honesty.sensitivity}" if honesty.sensitivity else "")
    )


def _budget_family(ctx: SweepContext, study: Any) -> tuple[list[Any], tuple[dict, int] | None]:
    """A budgeted study's runs at every token budget (ablate.recipe.budgets) and Holm's family over them:
    the table's stars are corrected over the study's comparisons, not the table's
    (ablate.report.holm_family); ([], None) for a study without budgets."""
    if ctx.recipe.budgets(ctx.scale) is None:
        return [], None
    from ablate.report.holm_family import budget_family

    budget_records = collect(ctx, study, with_curves=False, budgets=True)
    return budget_records, budget_family(list(ctx.recipe.variants), row_labels(ctx), budget_records)


def _notes(
    ctx: SweepContext,
    records: list[Any],
    headers: list[str],
    chosen: list[str],
    warnings: list[str],
    family: tuple[dict, int] | None,
) -> list[str]:
    """The notes under the table: what its cells are, its comparisons (their stars corrected over
    `family` where given), failed runs, the search's choices and warnings (the honesty checks' notes
    follow them)."""
    notes = [
        "Cells: mean over seeds [95% Student-t interval]. Δ: paired by seed against the first row; "
        "* when the interval excludes 0."
        + (
            " AR-Hit: loss on tokens that complete a bigram seen earlier in the same sequence; Others: every "
            "other token; the share column is AR-Hit's share of tokens."
            if "AR-Hit" in headers
            else ""
        )
    ]
    comparisons = comparisons_note(ctx, records, family)
    if comparisons:
        notes.append(comparisons)
    if any(r.state != "finished" for r in records):
        notes.append("Failed or pruned runs are counted in the seeds column and left out of the statistics.")
    if chosen:
        notes.append("Best over the search per variant: " + "; ".join(chosen) + ".")
    return notes + [f"WARNING: {w}" for w in warnings]


def _sections(ctx: SweepContext, all_records: list[Any], honesty: Any, folder: Path) -> tuple[str, list[Any]]:
    """The sections below the table's notes (sensitivity to the searched grid, lr transfer across sizes,
    the residual stream), with their files written into `folder`; and the transfer table's choices."""
    sections = ""
    if honesty.sensitivity:
        (folder / "lr_sensitivity.md").write_text(
            f"# {ctx.recipe.name} at scale {ctx.scale}: sensitivity to the "
            f"searched grid\n\n{honesty.sensitivity}"
        )
        sections = f"\n## Sensitivity to the searched grid\n\n{honesty.sensitivity}"
        write_csv(folder / "lr_sensitivity.csv", honesty.sensitivity_rows)
    transfer = lr_transfer(ctx, all_records)
    if transfer:  # a sized lr grid: does each row's best lr transfer across sizes (ablate.report.transfer)
        from ablate.report import transfer as lr

        sections += f"\n## Does the best lr transfer across sizes?\n\n{lr.transfer_markdown(transfer)}"
        write_csv(folder / "transfer.csv", lr.transfer_rows(transfer))
    if honesty.layers:
        sections += f"\n## Residual stream: why a row may lag\n\n{honesty.layers}"
        write_csv(folder / "layer_stats.csv", honesty.layer_rows)
    return sections, transfer


def _other_reports(
    ctx: SweepContext,
    study: Any,
    records: list[Any],
    budget_records: list[Any],
    folder: Path,
    compare_with: list[str],
) -> list[Path]:
    """The parts the runs have beyond the table: probes, a task's tables, every token budget (of
    `budget_records`), the runs beside other report folders' (`compare_with`); their files."""
    from ablate.report.probes import write_probe_report

    # Table 5 / Figure 8 when runs were probed (`ablate eval`)
    more = write_probe_report(ctx, records, folder)
    if task_report.is_task_recipe(ctx):  # Tables 2-3 and Figure 5 of a recipe whose data is a task
        more += task_report.write_task_report(ctx, records, folder)
    if ctx.recipe.budgets(ctx.scale) is not None:  # every row at every token budget (ablate.recipe.budgets)
        from ablate.report.budgets import write_budget_report

        more += write_budget_report(ctx, study, budget_records, folder)
    if compare_with:  # this report's runs beside another folder's (ablate.report.compare_runs)
        from ablate.report.compare_runs import write_comparisons

        more += write_comparisons(folder, ctx.stores.client(), compare_with)
    return more


def _readme_header(
    ctx: SweepContext,
    study: Any,
    all_records: list[Any],
    budget_records: list[Any],
    shown: int,
    paper: bool,
    files: str,
    when: dict[str, Any],
) -> str:
    """The generated part of the folder's README: how the report was made and what each file is (the
    code versions of every run, a budgeted study's budgets' too); `shown`: how many runs the table shows
    when it shows each variant's best of a search (else 0); `files`: the list after `loss_curves.png`'s
    place, each starting with a comma; `when`: the folder's provenance row (ablate.report.provenance)."""
    shown_text = f"; the table shows each variant's best, {shown} runs" if shown else ""
    return (
        f"# How this report was made\n\n- command: `{study_command(study)}`\n- recipe: `{ctx.recipe.path}` (scale `{ctx.scale}`, "
        f"seeds {sorted({r.seed for r in all_records}) or ctx.seeds})\n- study: `{ctx.study_name}` ({len(all_records)} runs{shown_text})\n"
        f"- code version of the runs: {runs_code_versions(all_records + budget_records)}\n- date: {date_line(when)}\n"
        f"- {wall_clock_line(when)}\n- precision: {when['precision']}\n"
        f"- files: `table.md`, `table.csv` (one row per run of the study; `in_table`: the table's), "
        "`summary.csv` (the table's cells as numbers)"
        + (", `paper.csv` (the paper's numbers the recipe quotes)" if paper else "")
        + files
        + f", `{PROVENANCE}` (when, how long, on which machine, torch and precision the runs trained)"
        + f", `{RUNS_FILE}` and `{METRICS_FILE}` (the runs: config, tags, params, every metric series; "
        + "`ablate report --from` rebuilds this folder from them)\n"
    )


def carries_ui_series(client: Any, records: list[Any]) -> bool:
    """Were the study's runs trained with the series the UI charts (`tokens/...`)? Then its workers logged
    the paired differences on the parent run too (ablate.report.ui_differences); a study trained before
    either existed has neither, and its README does not name them."""
    from ablate.store.tokens_axis import PREFIX

    run_id = next((r.run_id for r in records if r.run_id and r.state == "finished"), None)
    return bool(run_id) and any(key.startswith(PREFIX) for key in client.get_run(run_id).data.metrics)


def ui_series_line(budgets: bool) -> str:
    """The README line that names the series of the sweep's parent run (ablate.report.ui_differences) where
    the UI shows the table's paired differences, as `ablate.store.difference_keys` names them."""
    from ablate.store.difference_keys import BUDGET, DIFF

    budget = f", and `{BUDGET}/val/loss/<row>/...` at each budget" if budgets else ""
    return (
        f"- in the MLflow UI: the sweep's parent run holds each row's paired difference from the reference "
        f"row against training tokens, `{DIFF}/<metric>/<row>/mean`, `low` and `high` (the 95% interval's "
        f"ends; `mean` alone with one seed){budget}; the link `ablate ui` prints opens their charts\n"
    )


def lr_transfer(ctx: SweepContext, records: list[Any]) -> list[Any]:
    """The transfer table's choices (ablate.report.transfer): this study's best lr per row and size, then
    those of the grid the search spec compares with; [] unless the study searched the lr at 2+ sizes."""
    from ablate.report import transfer as lr
    from ablate.report.table import size_order

    own = lr.own_choices(records, list(ctx.recipe.variants), size_order(ctx, records), row_labels(ctx))
    other = ctx.search.compare_with
    return own + (lr.compared_choices(other.path, other.label) if own and other else [])


def rebuild_report(folder: Path) -> Path:
    """`ablate report --from FOLDER`: write FOLDER's report again from its export alone (no store, no
    training), with the recipe file the export names, read from this checkout."""
    from ablate.recipe.search import SearchSpec, load_search_spec
    from ablate.store.export import SCHEME, exported_study, reading
    from ablate.store.stores import Stores
    from ablate.store.study import SweepContext

    with reading(folder) as settings:  # the export and every file it names, as data
        if "fit" in settings:
            raise UserError(
                f"ablate report --from: {folder} is a grid fit's folder; use ablate fit --from {folder}"
            )
        recipe = exported_recipe(settings)
        ctx = SweepContext(
            recipe=recipe,
            scale=recipe.scale,
            seeds=settings["seeds"],
            stores=Stores(folder, tracking_uri=SCHEME + str(folder)),
            search=load_search_spec(settings["search"]) if settings["search"] else SearchSpec(),
            search_path=settings["search"],
            grace_period=settings["grace_period"],
            progress=False,
        )
        return write_report(ctx, exported_study(folder), folder, settings.get("compare_with"))


def exported_recipe(settings: dict[str, Any]) -> Any:
    """The recipe an export's report settings name (export_settings), read from this checkout, with the
    overrides and scale the report was written with (inside ablate.store.export.reading, which read it as
    data first)."""
    from ablate.recipe.loading import load_recipe

    return load_recipe(settings["recipe"], [tuple(o) for o in settings["overrides"]], scale=settings["scale"])


def export_settings(ctx: SweepContext) -> dict[str, Any]:
    """What `ablate report --from` needs besides the runs to write this report again (ablate.store.export)."""
    return {
        "recipe": inside_checkout(ctx.recipe.path),
        "scale": ctx.scale,
        "seeds": list(ctx.seeds),
        "search": ctx.search_path and inside_checkout(ctx.search_path),
        "grace_period": ctx.grace_period,
        "overrides": [[f"base.{key}", value] for key, value in ctx.recipe.base_overrides],
    }


def inside_checkout(path: Any) -> str:
    """A recipe's (search spec's) path as an export keeps it: relative to the current folder when inside it
    (`ablate report --from` takes no other: ablate.store.export_checks.check_settings)."""
    path = Path(path)
    if path.is_absolute() and path.resolve().is_relative_to(Path.cwd().resolve()):
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    return str(path)


def study_command(study: Any) -> str:
    """The `ablate sweep` command that made the study (recorded when it was enqueued), else this one's."""
    from ablate.store.study import command_line

    return portable_command(study.user_attrs.get("command") or command_line())


def runs_code_versions(records: list[Any]) -> str:
    """The code versions the runs were trained with (their `ablate.code_version` tags), not the reader's."""
    versions = sorted({r.tags.get(names.CODE_VERSION, "") for r in records} - {""})
    return ", ".join(f"`{v}`" for v in versions) or "not recorded"


def _attach(ctx: SweepContext, study: Any, folder: Path) -> None:
    parent = study.user_attrs.get(names.PARENT_RUN_ATTR)
    if not parent:
        return
    client = ctx.stores.client()
    refuse_links(folder, "ablate report")  # checked again when read: nothing uploaded through a link
    tracking.log_files(client, parent, sorted(folder.iterdir()), artifact_path="report")
    done, total = _counts(study)
    tracking.log_metrics(client, parent, {"trials_finished": done, "trials": total}, step=0)
    if done == total:
        client.set_terminated(parent, status="FINISHED")


def _counts(study: Any) -> tuple[int, int]:
    from ablate.store.study import progress_counts

    done, total, _ = progress_counts(study)
    return done, total
