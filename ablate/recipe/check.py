"""Every variant's shape and cost, and whether they are matched within tolerance (what `ablate check` prints).

Below the table it says how each row's FLOPs were counted, the knob values solved by `match:`, and every
recipe choice injected into components (`ablate.core.contract.COMPARED`) that a row's component does not take
while the other rows' components do (an attention without `position` beside RoPE rows trains without positional encoding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ablate.core import contract, registry
from ablate.core.tables import markdown_table, si
from ablate.model.config import ModelConfig
from ablate.model.cost import Cost, attention_shape, model_cost, relative_deviation
from ablate.recipe.matching import Tolerance
from ablate.recipe.resolve import Recipe, RunSpec

KINDS = ("attention", "ffn", "norm")  # the model's components, as `model.<kind>` names them


@dataclass
class VariantCost:
    run: RunSpec
    cost: Cost  # parameters and forward FLOPs per token (ablate.model.cost)
    shape: dict[str, str]


# The columns of `ablate check`'s table, in order (tests read the printed table by them).
CHECK_COLUMNS = (
    "variant",
    "label",
    "#heads",
    "d",
    "GN",
    "λ_init",
    "params",
    "FLOPs/token (fwd)",
    "Δparams",
    "ΔFLOPs",
    "matched",
)


def variant_costs(recipe: Recipe, scale: str | None) -> list[VariantCost]:
    """Each variant's (and size's) budget and attention shape at `scale`, from the loaded runs when the
    recipe was loaded at that scale."""
    if scale in (None, recipe.scale):
        runs = recipe.runs_for(recipe.seeds[:1])
    else:
        runs = recipe.resolve(scale, seeds=recipe.seeds[:1])
    return [
        VariantCost(run, model_cost(run.model, run.train.seq_len), attention_shape(run.model)) for run in runs
    ]


def row_name(run: RunSpec) -> str:
    return run.variant + (f"@{run.size}" if run.size else "")


def check_table(costs: list[VariantCost], tolerance: Tolerance) -> tuple[str, list[str]]:
    """The table `ablate check` prints, and the variants beyond tolerance (against the first row of each size)."""
    table, unmatched = [], []
    reference: dict[str | None, Cost] = {}
    for row in costs:
        ref = reference.setdefault(row.run.size, row.cost)
        dp = relative_deviation(row.cost.params, ref.params)
        df = relative_deviation(row.cost.fwd_flops_per_token, ref.fwd_flops_per_token)
        bad = abs(dp) > tolerance.params or abs(df) > tolerance.flops
        if bad:
            unmatched.append(row_name(row.run))
        table.append(
            [
                row.run.variant + (f" ({row.run.size})" if row.run.size else ""),
                row.run.label,
                row.shape["heads"],
                row.shape["d"],
                row.shape["gn"],
                row.shape["lambda_init"],
                f"{row.cost.params:,}",
                si(row.cost.fwd_flops_per_token),
                f"{dp:+.2%}",
                f"{df:+.2%}",
                "UNMATCHED" if bad else "ok",
            ]
        )
    return markdown_table(list(CHECK_COLUMNS), table, align="llrrllrrrrl"), unmatched


def flops_note(costs: list[VariantCost]) -> str:
    """Which rows' FLOPs came from hand-written `flops()` and which were counted automatically."""
    counted = [f"variants.{row_name(c.run)} ({', '.join(c.cost.counted)})" for c in costs if c.cost.counted]
    if not counted:
        return "FLOPs: every component's own flops()"
    return (
        "FLOPs: components' own flops(), except counted automatically (FlopCounterMode on fake tensors, "
        f"batch 1, math attention: maps dense): {'; '.join(counted)}"
    )


def solved_notes(recipe: Recipe, costs: list[VariantCost]) -> list[str]:
    """One line per variant whose knob `match:` solved: the value training uses."""
    from ablate.recipe.matching import solved_line

    reference: dict[str | None, VariantCost] = {}
    lines = []
    for row in costs:
        first = reference.setdefault(row.run.size, row)
        line = solved_line(
            recipe.raw["variants"][row.run.variant], row.run, first.run.variant, row.cost, first.cost
        )
        if line:
            lines.append(f"variants.{row_name(row.run)}: {line}")
    return lines


def warmup_notes(costs: list[VariantCost]) -> list[str]:
    """A line for rows whose warmup is as long as the run: their learning rate never reaches `train.lr`
    (typically `--base.train.steps` lowered without `--base.train.warmup_steps`); one line when every row
    is alike."""
    short = {row_name(c.run): c.run.train for c in costs if c.run.train.warmup_steps >= c.run.train.steps}

    def line(where: str, train: Any) -> str:
        return (
            f"{where}train.warmup_steps {train.warmup_steps} >= train.steps {train.steps}: the learning rate "
            f"rises for the whole run and never reaches train.lr {train.lr:g} (lower train.warmup_steps too)"
        )

    if (
        short
        and len(short) == len(costs)
        and len({(t.warmup_steps, t.steps, t.lr) for t in short.values()}) == 1
    ):
        return [line("", next(iter(short.values())))]
    return [line(f"variants.{name}: ", train) for name, train in short.items()]


def structure_differences(costs: list[VariantCost]) -> list[str]:
    """One line per injected structure a row's component does not take while other rows' components do."""
    taken = [
        {
            kind: contract.consumed(
                registry.split_spec(getattr(c.run.model, kind), kind=kind, key=f"model.{kind}")[0], kind
            )
            for kind in KINDS
        }
        for c in costs
    ]
    lines = []
    for i, cost in enumerate(costs):
        model = cost.run.model
        others = [j for j in range(len(costs)) if j != i]
        for kind in KINDS:
            used = set().union(*(taken[j][kind] for j in others)) & set(contract.COMPARED)
            for name in sorted(used - taken[i][kind]):
                if name == "position" and registry.spec_name(model.position) == "none":
                    continue  # nothing to miss
                users = [j for j in others if name in taken[j][kind]]
                who = (
                    "the other rows use"
                    if len(users) == len(others)
                    else f"{', '.join('variants.' + row_name(costs[j].run) for j in users)} use"
                )
                lines.append(
                    f"variants.{row_name(cost.run)}: model.{kind} does not take {_source(name, model)} "
                    f"that {who}: {contract.CONSEQUENCE.get(name, 'it does not follow that setting')}"
                )
    return lines


def _source(name: str, model: ModelConfig) -> str:
    where = contract.SOURCE.get(name, name)
    value = {
        "position": lambda: registry.spec_name(model.position),
        "backend": lambda: model.attention_backend,
    }.get(name, lambda: getattr(model, where.split(".")[-1], None))()
    return f"{where} ({value})" if value is not None else where


def mup_notes(costs: list[VariantCost]) -> list[str]:
    """What `sweep` and `train` would refuse of a μP model, found now: every parameter's declared role and
    the base model built (on `meta`, as training builds them; one line naming the key on a failure); and a
    note for a base wider or deeper than the model, where μP's rules shrink what was tuned instead of
    transferring it to a larger model."""
    from ablate.model.decoder import build_model

    notes = []
    for c in costs:
        if not c.run.model.parsed_parametrization.mup:
            continue
        model = build_model(c.run.model, device="meta")
        p = model.parametrization
        model.mup_basis  # noqa: B018 -- roles and the base model: each failure a UserError line
        cfg = model.config
        if p.base_d_model > cfg.d_model or p.base_n_layers > cfg.n_layers:
            notes.append(
                f"{row_name(c.run)}: model.parametrization's base (d_model {p.base_d_model}, n_layers "
                f"{p.base_n_layers}) is larger than the model (d_model {cfg.d_model}, n_layers {cfg.n_layers}): "
                "μP carries hyperparameters tuned at the base to wider models; here they are scaled down "
                "to a narrower one (set base_d_model to the width the learning rate was tuned at)"
            )
    return notes
