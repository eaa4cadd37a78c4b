"""`ablate check`: every variant's shape and cost, whether they are matched within the recipe's
tolerance, and the passes each run makes over its corpus (ablate.recipe.check builds the table); with
`--coord`, the coordinate check of the recipe's variants at its scale instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ablate.core.errors import UserError
from ablate.verbs.options import Shared, load, shared

if TYPE_CHECKING:
    from ablate.recipe.check import VariantCost
    from ablate.recipe.resolve import Recipe

# The coordinate check's training windows are drawn from the corpus's first tokens: a few steps need few.
PREFIX_TOKENS = 4_000_000


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
    """Print-ready report (table, then notes, then the memory plan); raises UserError when a row's plan fits
    no GPU (after printing the report) or a variant is beyond the recipe's tolerance."""
    from ablate.recipe.check import (
        check_table,
        flops_note,
        mup_notes,
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
        *mup_notes(costs),
    ]
    memory, refused = memory_report(recipe, scale, costs)
    report = table + "\n\n" + "\n".join(notes) + "\n" + memory
    if refused:  # before anything trains: a sweep's plan is this check's
        print(report)
        raise UserError(refused)
    if unmatched and not allow_unmatched:
        tol = recipe.tolerance
        print(report)
        raise UserError(
            f"variants.{unmatched[0]}: params or FLOPs per token differ from the first variant by more than "
            f"the tolerance (params {tol.params:.0%}, flops {tol.flops:.0%}): {', '.join(unmatched)}; "
            "match them, raise `tolerance:` in the recipe, or pass --allow-unmatched"
        )
    return report


def run_coord(
    loaded: Any,
    opts: Any,
    widths: list[int] | None,
    steps: int,
    seeds: list[int],
    variants: list[str] | None,
    out: str,
) -> int:
    """`--coord`: pick the runs (one size), the data and the widths; ablate.train.coord trains and measures,
    ablate.report.coord writes the CSVs, the plot and the report."""
    import time
    from pathlib import Path

    import torch

    from ablate.data import load_tokens
    from ablate.report.coord import write
    from ablate.train.coord import as_dicts, coord_check

    runs = loaded.runs_for(seeds[:1], variants)
    first_size = runs[0].size
    runs = [run for run in runs if run.size == first_size]  # one size: the check varies width itself
    base = runs[0].model.to_dict()
    widths = widths or [base["d_model"] // 2, base["d_model"], 2 * base["d_model"], 4 * base["d_model"]]
    if len(widths) < 2 or steps < 1:
        raise UserError("--coord_widths: the coordinate check needs 2 or more widths and --coord_steps >= 1")
    train = runs[0].train
    data = load_tokens(runs[0].data, opts.layout)
    tokens = torch.as_tensor(data.train[:PREFIX_TOKENS].astype("int64"))
    started = time.perf_counter()
    rows = coord_check(
        {run.variant: {**run.model.to_dict(), "parametrization": "standard"} for run in runs},
        tokens,
        widths=widths,
        steps=steps,
        seeds=seeds,
        batch_size=train.micro_batch_size,
        seq_len=train.seq_len,
        lr=train.lr,
        weight_decay=train.weight_decay,
        betas=tuple(train.betas),
        eps=train.eps,
    )
    text = write(as_dicts(rows), Path(out), labels=loaded.row_labels)
    print(text)
    print(
        f"coordinate check of {', '.join(run.variant for run in runs)} at widths {widths}, {steps} steps, "
        f"seeds {seeds}: {time.perf_counter() - started:.0f} s; written to {out}"
    )
    return 0


def memory_report(recipe: Recipe, scale: str | None, costs: list[VariantCost]) -> tuple[str, str]:
    """The memory table `ablate check` and a sweep's plan print: each row a GPU under the strategy it
    trains with (ablate.train.choices.strategy: `auto` over several devices is ddp where a replica fits,
    else fsdp), with its GPU-hours (ablate.sweep.estimate.gpu_hours); and the refusal of the rows that
    fit no GPU, one line ("" where every row fits)."""
    from ablate.core.tables import si
    from ablate.recipe.check import row_name
    from ablate.sweep.estimate import GPU_ASSUMPTION, gpu_hours
    from ablate.train.choices.strategy import choose_strategy, refusal

    lines, refused, hours, first = [], [], 0.0, ""
    card = None
    for c in costs:
        choice = choose_strategy(c.run.model, c.run.train)
        card = choice.card
        row, plan = row_name(c.run), choice.plan
        run_hours = gpu_hours(c.run, plan.precision)
        hours += run_hours
        lines.append(
            f"  {row} ({plan.precision}; {choice.why()}): {si(plan.total)}B a GPU ({plan.row()}); "
            f"{_hours(run_hours)} GPU-hours" + ("" if choice.fits else ": DOES NOT FIT")
        )
        if not choice.fits:
            refused.append(row)
            if len(refused) == 1:  # the first row's refusal says what would fit (each option planned)
                first = refusal(f"{recipe.name} {scale} row {row}", c.run.model, c.run.train, choice)
    header = (
        f"memory per GPU against {card.name if card else 'the plan card'}, each row in the precision it takes "
        "there, under the strategy it trains with (activations as this machine runs the attention backend); "
        f"{GPU_ASSUMPTION}:"
    )
    total = f"  {_hours(hours)} GPU-hours for the {len(costs)} rows at one seed"
    more = f" (and {len(refused) - 1} more rows: {', '.join(refused[1:])})" if len(refused) > 1 else ""
    return "\n".join([header, *lines, total]), first + more


def _hours(hours: float) -> str:
    return f"{hours:,.0f}" if hours >= 10 else f"{hours:.2g}"
