"""`ablate fit`: scaling laws fitted to the finished runs of a recipe's sweep (ablate.report.fit_sweep), to a
CSV of points (ablate.report.fit), or a grid fit's folder written again from its export (`--from`: no store).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from ablate.core.errors import UserError
from ablate.verbs.options import Shared, load, shared


@shared("scale", "workspace", "tracking_uri", "storage")
def fit(
    recipe: str | None = None,
    csv: str | None = None,
    from_: str | None = None,
    form: Literal["size", "tokens", "joint", "grid"] | None = None,
    out: str | None = None,
    bootstrap: int = 1000,
    params_count: Literal["non_embedding", "total"] = "non_embedding",
    compare_with: str | None = None,
    *,
    overrides: list | None = None,
    **options: Any,
) -> int:
    """Fit scaling laws to a sweep's finished runs (or to a CSV of points).

    Args:
        recipe: recipe of the sweep (or give --csv)
        csv: fit points from a CSV: columns params, tokens, loss[, arch, run_id]
        from_: a grid fit's folder to write again from its export (runs.parquet, metrics.parquet), with no
            store
        form: law to fit (default: size; grid, the joint and per-axis fits with paired-seed ratios, for
            sizes x token budgets)
        out: output folder (default reports/<recipe>[-<scale>])
        bootstrap: bootstrap resamples over runs
        params_count: which parameter count N is (non_embedding: Kaplan et al.)
        compare_with: an earlier grid fit's folder to set this grid's ratios and gaps beside, e.g.
            reports/scaling-cpu/ (grid fits only; ablate.report.grid_compare)
    """
    from ablate.report.fit_sweep import rebuild_fit, run_fit_recipe

    if from_:
        if recipe or csv or overrides or compare_with:
            raise UserError(
                "ablate fit --from: the export names its recipe; give no recipe, --csv, --compare-with or overrides"
            )
        written = rebuild_fit(Path(from_))
    elif csv:
        from ablate.report.fit import run_fit_csv

        if recipe or compare_with:
            raise UserError(
                "ablate fit: give a recipe or --csv FILE, not both; --compare-with needs a recipe"
            )
        if bootstrap < 1:
            raise UserError(f"--bootstrap: expected a positive number, got {bootstrap}")
        written = run_fit_csv(csv, form or "size", out or "reports/fit", n_boot=bootstrap)
    else:
        if not recipe:
            raise UserError("ablate fit: give a recipe (e.g. recipes/scaling-size.yaml) or --csv FILE")
        opts = Shared(**options)
        loaded = load(recipe, overrides, opts.scale)
        written = run_fit_recipe(
            loaded,
            opts.stores,
            scale=loaded.scale,
            form=form,
            out=Path(out) if out else None,
            n_boot=bootstrap,
            params_count=params_count,
            compare_with=compare_with,
        )
    for path in written:
        print(path)
    return 0
