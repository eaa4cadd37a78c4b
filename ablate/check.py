"""`ablate check`: every variant's shape and cost, and whether they are matched within tolerance."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from ablate import registry
from ablate.budget import Budget, model_budget, relative_deviation
from ablate.errors import UserError
from ablate.model import build_model
from ablate.recipe import Recipe, RunSpec
from ablate.tables import markdown_table, si


@dataclass
class VariantCost:
    run: RunSpec
    budget: Budget
    shape: dict[str, object]


def attention_shape(run: RunSpec) -> dict[str, object]:
    """Heads, head dimension, per-head norm and λ_init rule, read off the built (meta) attention."""
    model = build_model(run.config["model"], device="meta")
    attention = model.blocks[0].attention
    spec = run.config["model"]["attention"]
    cls, options = registry.split_spec(spec, kind="attention", key="model.attention")
    lam = "-"
    accepted = inspect.signature(cls).parameters
    if "lambda_init" in accepted:  # the λ_init rule: the recipe's, or the component's default
        lam = _lambda_rule(options.get("lambda_init", accepted["lambda_init"].default))
    return {
        "attention": registry.spec_name(spec),
        "heads": getattr(attention, "n_heads", "?"),
        "d": getattr(attention, "head_width", getattr(attention, "head_dim", "?")),
        "gn": "yes" if getattr(attention, "subln", None) is not None else "no",
        "lambda_init": lam,
    }


def _lambda_rule(spec: object) -> str:
    if isinstance(spec, dict) and spec.get("name") == "constant":
        return f"constant {spec.get('value', 0.8)}"
    return registry.spec_name(spec)


def variant_costs(recipe: Recipe, scale: str | None) -> list[VariantCost]:
    costs = []
    for run in recipe.resolve(scale, seeds=recipe.seeds[:1]):
        budget = model_budget(run.config["model"], run.config["train"]["seq_len"])
        costs.append(VariantCost(run, budget, attention_shape(run)))
    return costs


def check_table(costs: list[VariantCost], tolerance: dict[str, float]) -> tuple[str, list[str]]:
    """The table `ablate check` prints, and the variants beyond tolerance (against the first row of each size)."""
    rows, unmatched = [], []
    reference: dict[str | None, Budget] = {}
    for cost in costs:
        ref = reference.setdefault(cost.run.size, cost.budget)
        dp = relative_deviation(cost.budget.params, ref.params)
        df = relative_deviation(cost.budget.fwd_flops_per_token, ref.fwd_flops_per_token)
        bad = abs(dp) > tolerance["params"] or abs(df) > tolerance["flops"]
        if bad:
            unmatched.append(f"{cost.run.variant}" + (f"@{cost.run.size}" if cost.run.size else ""))
        rows.append([
            cost.run.variant + (f" ({cost.run.size})" if cost.run.size else ""), cost.run.label,
            cost.shape["heads"], cost.shape["d"], cost.shape["gn"], cost.shape["lambda_init"],
            f"{cost.budget.params:,}", si(cost.budget.fwd_flops_per_token), f"{dp:+.2%}", f"{df:+.2%}",
            "UNMATCHED" if bad else "ok",
        ])
    headers = ["variant", "label", "#heads", "d", "GN", "λ_init", "params", "FLOPs/token (fwd)",
               "Δparams", "ΔFLOPs", "matched"]
    return markdown_table(headers, rows, align="llrrllrrrrl"), unmatched


def run_check(recipe: Recipe, scale: str | None, allow_unmatched: bool = False) -> str:
    """Print-ready report; raises UserError when a variant is beyond the recipe's tolerance."""
    costs = variant_costs(recipe, scale)
    table, unmatched = check_table(costs, recipe.tolerance)
    if unmatched and not allow_unmatched:
        tol = recipe.tolerance
        print(table)
        raise UserError(
            f"variants.{unmatched[0]}: params or FLOPs per token differ from the first variant by more than "
            f"the tolerance (params {tol['params']:.0%}, flops {tol['flops']:.0%}): {', '.join(unmatched)}; "
            "match them, raise `tolerance:` in the recipe, or pass --allow-unmatched"
        )
    return table
