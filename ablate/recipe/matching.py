"""Matching by solving: a variant names one numeric model knob and the resolver chooses its value.

    variants:
      diff_v2:
        label: Diff V2
        model: {attention: {name: diff_v2}}
        match: model.ffn.hidden_mult     # the knob to solve for (any numeric model key or component option)
        match_on: params                 # or flops (forward FLOPs per token); default params

The knob's value is chosen so that the variant's parameters (or FLOPs) equal the first variant's of the
same size, counted on the meta device (`ablate.model.cost.model_cost`): bracketing from its configured value
(or the component's default), then bisection, assuming the budget grows or shrinks monotonically with the
knob. The solved value is written into the resolved config, so it is what training uses, what the run
records and what `ablate check` prints. A knob that cannot bring the budget within the recipe's tolerance
is a `UserError` naming the best value found.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jsonargparse.typing import NonNegativeFloat

from ablate.core import registry
from ablate.core.errors import UserError

MATCH_ON = ("params", "flops")
COMPONENTS = ("attention", "norm", "ffn", "position")


@dataclass(frozen=True)
class Tolerance:
    """The recipe's `tolerance:` section: how far a variant's budget may be from the first row's.

    Attributes:
        params: largest relative difference in parameters
        flops: largest relative difference in forward FLOPs per token
    """

    params: NonNegativeFloat = 0.02
    flops: NonNegativeFloat = 0.02


def solve_matches(
    configs: dict[str, dict[str, Any]],
    variants: Mapping[str, Mapping[str, Any]],
    tolerance: Mapping[str, float],
) -> dict[str, dict[str, Any]]:
    """The resolved configs of one size (variant -> config, recipe order) with every `match:` knob solved
    against the first variant. The hook `Recipe.resolve` calls; configs without `match:` pass unchanged."""
    first = next(iter(configs))
    solved = dict(configs)
    for key, variant in variants.items():
        if key not in configs or variant.get("match") is None:
            continue
        path, on = match_request(key, variant)
        if key == first:
            raise UserError(
                f"variants.{key}.match: the first variant is the reference the others are matched to; "
                "move `match:` to a later variant"
            )
        solved[key] = solve(configs[key], configs[first], path, on, tolerance[on], key=key, reference=first)
    return solved


def match_request(key: str, variant: Mapping[str, Any]) -> tuple[str, str]:
    """(knob path, "params" | "flops") of a variant, validated."""
    path, on = variant.get("match"), variant.get("match_on", "params")
    if not isinstance(path, str) or not path.startswith("model.") or len(path.split(".")) not in (2, 3):
        raise UserError(
            f"variants.{key}.match: expected a numeric model knob like model.ffn.hidden_mult or "
            f"model.d_model, got {path!r}"
        )
    if on not in MATCH_ON:
        raise UserError(f"variants.{key}.match_on: expected one of {', '.join(MATCH_ON)}, got {on!r}")
    return path, on


def solve(
    config: dict[str, Any],
    target_config: dict[str, Any],
    path: str,
    on: str,
    tol: float,
    *,
    key: str,
    reference: str,
) -> dict[str, Any]:
    """`config` with the knob at `path` set so that its `on` budget is within `tol` of `target_config`'s:
    the knob's value bracketed from its start, then bisected."""
    from ablate.model.cost import model_cost  # budgets build models: only when a recipe asks to solve

    def measure(cfg: dict[str, Any]) -> float:
        budget = model_cost(cfg["model"], cfg["train"]["seq_len"])
        return float(budget.params if on == "params" else budget.fwd_flops_per_token)

    target = measure(target_config)
    start = knob_value(config, path, key=key)
    integer = isinstance(start, int)
    tried: dict[float, float] = {}  # value -> relative deviation

    def gap(value: float) -> float | None:
        value = int(round(value)) if integer else value
        if value not in tried:
            try:
                tried[value] = measure(with_knob(config, path, value, key=key)) / target - 1
            except UserError:  # not a buildable value (e.g. a width the heads do not divide)
                return None
        return tried[value]

    if start <= 0:
        raise UserError(f"variants.{key}.match: {path} must be positive to solve for, got {start!r}")
    g0 = gap(start)
    if g0 is None:
        raise UserError(f"variants.{key}.match: the starting value {start!r} of {path} does not build")
    # Bracket a sign change: double (or halve) away from the start, in the direction that shrinks the gap.
    lo, g_lo = float(start), g0
    up = gap(start * 2)
    factor = 2.0 if up is not None and (up * g0 <= 0 or abs(up) < abs(g0)) else 0.5
    hi, g_hi = lo, g_lo
    for _ in range(16):
        if g_lo * g_hi <= 0 and lo != hi:
            break
        nxt = hi * factor
        g = gap(nxt)
        if g is None or (integer and round(nxt) == round(hi)):
            break
        lo, g_lo, hi, g_hi = hi, g_hi, nxt, g
    if g_lo * g_hi <= 0 and lo != hi:  # bisect [lo, hi] (either order)
        for _ in range(60):
            if abs(hi - lo) <= (1 if integer else 1e-6 * max(abs(hi), 1.0)):  # finer than a unit of width
                break
            mid = (lo + hi) / 2 if not integer else float((int(round(lo)) + int(round(hi))) // 2)
            g = gap(mid)
            if g is None or g == 0 or mid in (lo, hi):
                break
            if (g < 0) == (g_lo < 0):
                lo, g_lo = mid, g
            else:
                hi, g_hi = mid, g
    best = min(tried, key=lambda v: abs(tried[v]))
    if abs(tried[best]) > tol:
        raise UserError(
            f"variants.{key}.match: no value of {path} brings {on} within {tol:.0%} of variants.{reference}'s "
            f"(closest: {_fmt(best)} gives {tried[best]:+.2%}); choose another knob or set it by hand"
        )
    value = int(best) if integer else _short(best, tried[best], lambda v: gap(v))
    return with_knob(config, path, value, key=key)


def _short(value: float, deviation: float, gap) -> float:
    """The shortest decimal (fewest significant digits) with the same budget as `value`."""
    for digits in range(2, 13):
        candidate = float(f"{value:.{digits}g}")
        if gap(candidate) == deviation:
            return candidate
    return value


def _fmt(value: float) -> str:
    return f"{value:.6g}"


# --- knobs -------------------------------------------------------------------------------------------


def knob_value(config: dict[str, Any], path: str, *, key: str) -> float | int:
    """The knob's current value: set in the config, else the component's default."""
    parts = path.split(".")[1:]
    model = config["model"]
    if len(parts) == 1:
        value = model.get(parts[0])
    else:
        kind, option = parts
        if kind not in COMPONENTS:
            raise UserError(
                f"variants.{key}.match: {path}: {kind!r} is not a component; "
                f"components: {', '.join(COMPONENTS)}"
            )
        cls, options = registry.split_spec(model[kind], kind=kind, key=f"model.{kind}")
        value = options.get(option)
        if value is None:
            param = inspect.signature(cls).parameters.get(option)
            if param is None:
                raise UserError(
                    f"variants.{key}.match: {path}: {registry.spec_name(model[kind])} has no option "
                    f"{option!r}"
                )
            value = None if param.default is inspect.Parameter.empty else param.default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UserError(f"variants.{key}.match: {path} must be a number to solve for, got {value!r}")
    return value


def with_knob(config: dict[str, Any], path: str, value: float | int, *, key: str) -> dict[str, Any]:
    """A copy of `config` with the knob at `path` set to `value` (a component given by name becomes
    `{name: ..., option: value}`; a class_path spec gets it in `init_args`)."""
    config = copy.deepcopy(config)
    parts = path.split(".")[1:]
    model = config["model"]
    if len(parts) == 1:
        model[parts[0]] = value
        return config
    kind, option = parts
    spec = model[kind]
    if isinstance(spec, str):
        spec = {"name": spec}
    spec = dict(spec)
    if "class_path" in spec:
        spec["init_args"] = {**(spec.get("init_args") or {}), option: value}
    else:
        spec[option] = value
    model[kind] = spec
    return config


def solved_line(
    variant: Mapping[str, Any], run: Any, reference: str, budget: Any, reference_budget: Any
) -> str:
    """`ablate check`'s note for a solved variant ('' for the others)."""
    if "match" not in variant:
        return ""
    path, on = match_request(run.variant, variant)
    value = knob_value(run.config, path, key=run.variant)
    dp = budget.params / reference_budget.params - 1
    df = budget.fwd_flops_per_token / reference_budget.fwd_flops_per_token - 1
    return (
        f"solved {path} = {_fmt(value)} to match {on} of variants.{reference} "
        f"(params {dp:+.2%}, FLOPs {df:+.2%})"
    )
