"""`ablate train`: one run of a recipe (resumed from its last checkpoint if interrupted), and with token
budgets a cooldown branch per smaller budget (ablate.train.branches).
"""

from __future__ import annotations

from typing import Any

from ablate.core.errors import UserError
from ablate.verbs.options import Shared, load, shared


@shared("scale", "workspace", "tracking_uri")
def train(
    recipe: str,
    variant: str,
    seed: int | None = None,
    size: str | None = None,
    *,
    overrides: list | None = None,
    **options: Any,
) -> int:
    """Train one variant of a recipe (resumes from its last checkpoint if interrupted); with budgets, the
    longest run and a cooldown branch per smaller budget.

    Args:
        recipe: recipe YAML file, e.g. recipes/table6.yaml
        variant: variant key, e.g. diff
        seed: seed (default: the recipe's first)
        size: size, for recipes with a sizes axis (scaling grids)
    """
    from ablate.model.decoder import meta_blocks
    from ablate.recipe.check import row_name
    from ablate.train.branches import train_budgets
    from ablate.train.choices.strategy import require_fit

    opts = Shared(**options)
    loaded = load(recipe, overrides, opts.scale)
    seeds = [seed] if seed is not None else loaded.seeds[:1]
    runs = loaded.runs_for(seeds, variants=[variant])
    sizes = [r.size for r in runs]
    if len(runs) > 1 or size is not None:
        if size not in sizes:
            raise UserError(
                f"--size: {'choose one' if size is None else repr(size) + ' is not'} of this "
                f"recipe's sizes at this scale: {', '.join(map(str, sizes))}"
            )
        runs = [r for r in runs if r.size == size]
    (run,) = runs
    meta_blocks(run.model)  # its components' options checked (one line each) before the workspace is touched
    require_fit(f"{loaded.name} {run.scale} row {row_name(run)}", run.model, run.train)  # its plan fits a GPU
    for result in train_budgets(run, opts.stores):
        print(result.summary())  # the run, then each smaller budget's branch (ablate.recipe.budgets)
    return 0
