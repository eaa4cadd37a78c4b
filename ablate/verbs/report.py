"""`ablate report`: a finished sweep's report folder written again from its store, or from its export
alone (`--from`: no store, no training).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ablate.core.errors import UserError
from ablate.verbs.options import Shared, print_ui_link, shared, sweep_context


@shared("scale", "seeds", "workspace", "tracking_uri", "storage", "reports", "search", "grace_period")
def report(
    recipe: str | None = None,
    from_: str | None = None,
    compare_with: list[str] | None = None,
    *,
    overrides: list | None = None,
    **options: Any,
) -> int:
    """Write the report of a sweep (table, CSV, loss curves).

    Args:
        recipe: recipe YAML file of the sweep
        from_: a report folder to write again from its export (runs.parquet, metrics.parquet), with no store
        compare_with: report folders to set this study's runs beside, run by run (the same variant, seed,
            budget, shape and lr): compared_<FOLDER NAME>.csv, e.g. reports/table6-cpu/
            (ablate.report.compare_runs)
    """
    from ablate.report.ui_differences import log_differences
    from ablate.report.write import rebuild_report, write_report
    from ablate.store.study import open_study, report_folder

    if from_:
        if recipe or overrides or compare_with:
            raise UserError(
                "ablate report --from: the export names its recipe and compared folders; give no recipe, "
                "--compare-with or overrides"
            )
        rebuild_report(Path(from_))
        return 0
    if not recipe:
        raise UserError("ablate report: give a recipe (e.g. recipes/table6.yaml) or --from reports/NAME/")
    if compare_with:
        from ablate.report.compare_runs import checked_folders
        from ablate.report.write import inside_checkout

        compare_with = checked_folders([inside_checkout(f) for f in compare_with])
    opts = Shared(**options)
    ctx = sweep_context(recipe, opts, opts.search, opts.grace_period, overrides)
    ctx = _read_only_if_unwritable(ctx)
    study, _ = open_study(ctx, create=False)
    write_report(ctx, study, report_folder(ctx, Path(opts.reports)), compare_with)
    log_differences(ctx, study)  # rows a sweep's workers settled without writing (a failed last trial)
    print_ui_link(ctx, opts)
    return 0


def _read_only_if_unwritable(ctx: Any) -> Any:
    """A workspace that cannot be written (a read-only mount, another user's) is read, and the report
    written from it; what would be recorded into its stores is not, and one line says so."""
    import dataclasses
    import os
    import sys

    root = ctx.stores.workspace.root
    if ctx.stores.tracking_uri or ctx.stores.storage_url or not root.is_dir() or os.access(root, os.W_OK):
        return ctx
    print(
        f"--workspace: {root} is read-only: the report is written from it, but nothing is recorded into its "
        "stores (the UI's differences and colours, the report's copy on the sweep's MLflow run); run "
        "ablate report again where the workspace can be written to add them",
        file=sys.stderr,
    )
    return dataclasses.replace(ctx, stores=dataclasses.replace(ctx.stores, read_only=True))
