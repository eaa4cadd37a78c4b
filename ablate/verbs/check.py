"""`ablate check`: every variant's shape and cost, whether they are matched within the recipe's
tolerance, and the passes each run makes over its corpus (ablate.recipe.check builds the table).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ablate.core.errors import UserError
from ablate.verbs.options import Shared, load, shared

if TYPE_CHECKING:
    from ablate.recipe.resolve import Recipe


@shared("scale", "workspace", "reports")
def check(
    recipe: str,
    allow_unmatched: bool = False,
    coord: bool = False,
    coord_widths: list[int] | None = None,
    coord_steps: int = 10,
    coord_seeds: list[int] | None = None,
    coord_variants: list[str] | None = None,
    coord_out: str | None = None,
    *,
    overrides: list | None = None,
    **options: Any,
) -> int:
    """Validate a recipe and compare the variants' params and FLOPs (exit 2 if unmatched); say how many
    training tokens its corpus holds and how many passes each run makes over them. With --coord, the
    coordinate check instead: standard and mup at several widths, per variant (ablate.train.coord).

    Args:
        recipe: recipe YAML file, e.g. recipes/table6.yaml
        allow_unmatched: exit 0 even if variants are unmatched
        coord: run the coordinate check (RMS of every layer's output and of its change against width)
        coord_widths: its widths (d_model; default: the scale's d_model x 1/2, 1, 2, 4)
        coord_steps: AdamW steps at each width
        coord_seeds: its seeds (default: 0 1)
        coord_variants: the variants checked (default: every variant of the scale)
        coord_out: folder for its CSVs, plot and report (default: <reports>/coord-<recipe>-<scale>)
    """
    from ablate.recipe.data_use import data_uses

    opts = Shared(**options)
    print(
        "[check] a recipe is code: its imports: and class_path import and run what they name; check only "
        "recipes you would run as a script",
        flush=True,
    )
    loaded = load(recipe, overrides, opts.scale)
    scale = loaded.scale
    if coord:
        from ablate.verbs.coord import run_coord

        out = coord_out or f"{opts.reports}/coord-{loaded.name}-{scale}"
        return run_coord(loaded, opts, coord_widths, coord_steps, coord_seeds or [0, 1], coord_variants, out)
    table = run_check(loaded, scale, allow_unmatched=allow_unmatched)
    print(
        f"recipe {loaded.name}, scale {scale}: params and forward FLOPs per token at seq_len "
        f"(matrix products, dense attention maps; training = 3x)"
    )
    print(table)
    for use in data_uses(loaded.runs_for(loaded.seeds[:1]), opts.layout, strict=False):
        print(use.line() + ("" if not use.repeats or use.allowed else f"; {use.refusal()}"))
    tol = loaded.tolerance
    print(
        f"all variants within tolerance (params {tol.params:.0%}, FLOPs {tol.flops:.0%}) of the first row"
        if "UNMATCHED" not in table
        else "unmatched variants allowed by --allow-unmatched"
    )
    return 0


def run_check(recipe: Recipe, scale: str | None, allow_unmatched: bool = False) -> str:
    """Print-ready report (table, then notes); raises UserError when a variant is beyond the recipe's tolerance."""
    from ablate.recipe.check import (
        check_table,
        flops_note,
        solved_notes,
        structure_differences,
        variant_costs,
        warmup_notes,
    )

    costs = variant_costs(recipe, scale)
    table, unmatched = check_table(costs, recipe.tolerance)
    notes = [
        flops_note(costs),
        *solved_notes(recipe, costs),
        *structure_differences(costs),
        *warmup_notes(costs),
    ]
    report = table + "\n\n" + "\n".join(notes)
    if unmatched and not allow_unmatched:
        tol = recipe.tolerance
        print(report)
        raise UserError(
            f"variants.{unmatched[0]}: params or FLOPs per token differ from the first variant by more than "
            f"the tolerance (params {tol.params:.0%}, flops {tol.flops:.0%}): {', '.join(unmatched)}; "
            "match them, raise `tolerance:` in the recipe, or pass --allow-unmatched"
        )
    return report
