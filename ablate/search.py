"""Search specs (`sweeps/*.yaml`): how to search over dotted recipe keys around a recipe's variants.

    name: lr
    sampler: grid            # grid | random | tpe
    trials_per_variant: 4    # random / tpe: sampled trials per variant and seed (grid: the grid's size)
    space:
      base.train.lr: {values: [1.0e-3, 3.0e-3, 1.0e-2]}      # a list: grid or categorical
      # base.train.lr: {low: 1.0e-4, high: 1.0e-2, log: true}  # a range: random / tpe only
    pruner: {name: median, n_warmup_steps: 50}   # none | median | hyperband; reported at optimizer steps
    seed: 0                  # the sampler's seed

The protocol is "best per variant": each variant is represented by its best trial (mean over seeds of
the final validation loss), and the report warns when a variant's best value sits at the edge of a
searched range, where the optimum may lie outside it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ablate.config import load_yaml
from ablate.errors import UserError
from ablate.registry import closest

SAMPLERS = ("grid", "random", "tpe")
PRUNERS = ("none", "median", "hyperband")
SPEC_KEYS = ("name", "sampler", "trials_per_variant", "space", "pruner", "seed", "description")


@dataclass(frozen=True)
class Dimension:
    key: str  # dotted recipe key, starting with base.
    values: tuple | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False

    def suggest(self, trial: Any) -> Any:
        if self.values is not None:
            return trial.suggest_categorical(self.key, list(self.values))
        if self.integer:
            return trial.suggest_int(self.key, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.key, self.low, self.high, log=self.log)

    def at_edge(self, value: Any) -> bool:
        if self.values is not None:
            numeric = [v for v in self.values if isinstance(v, int | float) and not isinstance(v, bool)]
            return len(numeric) >= 3 and value in (min(numeric), max(numeric))
        span = (self.high - self.low) or 1.0
        return min(abs(value - self.low), abs(self.high - value)) <= 0.02 * span


@dataclass(frozen=True)
class SearchSpec:
    name: str = "grid"
    sampler: str = "grid"
    trials_per_variant: int = 1
    dimensions: tuple[Dimension, ...] = ()
    pruner: dict[str, Any] = field(default_factory=lambda: {"name": "none"})
    seed: int = 0

    def grid_points(self) -> list[dict[str, Any]]:
        """Every combination of the listed values (grid sampler), or one empty point."""
        if self.sampler != "grid" or not self.dimensions:
            return [{}]
        keys = [d.key for d in self.dimensions]
        return [dict(zip(keys, combo)) for combo in itertools.product(*(d.values for d in self.dimensions))]

    def make_sampler(self):
        import optuna

        if self.sampler == "tpe":
            return optuna.samplers.TPESampler(seed=self.seed)
        return optuna.samplers.RandomSampler(seed=self.seed)  # grid points are enqueued, never sampled

    def make_pruner(self):
        import optuna

        options = {k: v for k, v in self.pruner.items() if k != "name"}
        name = self.pruner.get("name", "none")
        try:
            if name == "median":
                return optuna.pruners.MedianPruner(**options)
            if name == "hyperband":
                return optuna.pruners.HyperbandPruner(**options)
            return optuna.pruners.NopPruner()
        except TypeError as e:
            raise UserError(f"pruner: bad option for {name}: {e}") from None


def load_search_spec(path: str | Path) -> SearchSpec:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--search: {str(path)!r} is not a file (search specs live in sweeps/)")
    try:
        raw = load_yaml(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise UserError(f"--search: {path}: invalid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(raw, dict):
        raise UserError(f"--search: {path} must hold a mapping")
    for key in raw:
        if key not in SPEC_KEYS:
            raise UserError(f"{key}: unknown search-spec key{closest(key, SPEC_KEYS)}; keys: {', '.join(SPEC_KEYS)}")
    sampler = raw.get("sampler", "grid")
    if sampler not in SAMPLERS:
        raise UserError(f"sampler: {sampler!r} is not one of {', '.join(SAMPLERS)}")
    pruner = raw.get("pruner") or {"name": "none"}
    if isinstance(pruner, str):
        pruner = {"name": pruner}
    if pruner.get("name") not in PRUNERS:
        raise UserError(f"pruner.name: {pruner.get('name')!r} is not one of {', '.join(PRUNERS)}")
    dims = []
    for key, dim in (raw.get("space") or {}).items():
        dims.append(_dimension(key, dim, sampler))
    trials = raw.get("trials_per_variant", 1)
    if not isinstance(trials, int) or trials < 1:
        raise UserError(f"trials_per_variant: expected a positive integer, got {trials!r}")
    return SearchSpec(name=str(raw.get("name", path.stem)), sampler=sampler, trials_per_variant=trials,
                      dimensions=tuple(dims), pruner=dict(pruner), seed=int(raw.get("seed", 0)))


def _dimension(key: str, dim: Any, sampler: str) -> Dimension:
    if not str(key).startswith("base."):
        raise UserError(f"space.{key}: searched keys are dotted recipe keys under base (like base.train.lr)")
    if not isinstance(dim, dict):
        raise UserError(f"space.{key}: expected {{values: [...]}} or {{low: ..., high: ..., log: ...}}")
    if "values" in dim:
        values = dim["values"]
        if not isinstance(values, list) or not values:
            raise UserError(f"space.{key}.values: expected a non-empty list")
        return Dimension(key, values=tuple(values))
    if sampler == "grid":
        raise UserError(f"space.{key}: the grid sampler needs a list of values, not a range")
    try:
        low, high = float(dim["low"]), float(dim["high"])
    except (KeyError, TypeError, ValueError):
        raise UserError(f"space.{key}: a range needs numeric low and high") from None
    if not low < high or (dim.get("log") and low <= 0):
        raise UserError(f"space.{key}: need 0 < low < high for log ranges and low < high otherwise")
    return Dimension(key, low=low, high=high, log=bool(dim.get("log", False)), integer=bool(dim.get("int", False)))
