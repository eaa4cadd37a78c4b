"""Search specs (`sweeps/*.yaml`): how to search over dotted recipe keys around a recipe's variants.

    name: lr
    sampler: grid            # grid | random | tpe
    trials_per_variant: 4    # random / tpe: sampled trials per variant and seed (grid: the grid's size)
    space:
      base.train.lr: {values: [1.0e-3, 3.0e-3, 1.0e-2]}      # a list: grid or categorical
      # base.train.lr: {low: 1.0e-4, high: 1.0e-2, log: true}  # a range: random / tpe only
    pruner: {name: median, n_warmup_steps: 50}   # none | median | hyperband; reported at optimizer steps
    seed: 0                  # the sampler's seed
    compare_with: {path: reports/scaling-size-cpu-lr/lr_sensitivity.csv, label: standard}  # optional

The protocol is "best per variant": each variant is represented by its best trial (mean over seeds of
the final validation loss), and the report warns when a variant's best value sits at the edge of a
searched range, where the optimum may lie outside it. A search over `base.train.lr` at two or more sizes
also says whether each row's best lr transfers across sizes (ablate.report.transfer), beside the earlier
grid `compare_with` names (its lr_sensitivity.csv, read from the checkout).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from jsonargparse.typing import NonNegativeInt, PositiveInt

from ablate.core.config import load_section, read_yaml_file, safe_name
from ablate.core.errors import UserError

SAMPLERS = ("grid", "random", "tpe")
PRUNERS = ("none", "median", "hyperband")


def point_label(point: tuple) -> str:
    """A searched point by its short keys, for tables and progress lines: (('base.train.lr', 0.001),) ->
    'lr=0.001'."""
    return ", ".join(
        f"{k.rsplit('.', 1)[-1]}={v:g}" if isinstance(v, float) else f"{k.rsplit('.', 1)[-1]}={v}"
        for k, v in point
    )


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
class CompareWith:
    """An earlier sized lr grid the report's transfer table sets beside this one's.

    Attributes:
        path: its lr_sensitivity.csv, relative to the checkout (e.g. reports/scaling-size-cpu-lr/lr_sensitivity.csv)
        label: how its rows are named in the table (e.g. its parametrization: standard)
    """

    path: str
    label: str = "compared"


@dataclass(frozen=True)
class SearchSpec:
    name: str = "grid"
    sampler: str = "grid"
    trials_per_variant: int = 1
    dimensions: tuple[Dimension, ...] = ()
    pruner: dict[str, Any] = field(default_factory=lambda: {"name": "none"})
    seed: int = 0
    compare_with: CompareWith | None = None

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


@dataclass(frozen=True)
class DimensionSpec:
    """One searched key: a list of values (grid or categorical) or a range (random / tpe).

    Attributes:
        values: the values to try
        low: the range's low end
        high: the range's high end
        log: sample the range on a log scale
        int: sample integers
    """

    values: list[Any] | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False
    int: bool = False


@dataclass(frozen=True)
class SearchFile:
    """A search spec file (`sweeps/*.yaml`), every key.

    Attributes:
        name: the search's name in studies and report folders (default: the file name)
        description: what is searched and why
        sampler: grid, random or tpe
        trials_per_variant: random / tpe: sampled trials per variant and seed (grid: the grid's size)
        space: dotted recipe keys under base -> the values or range to search
        pruner: none, median or hyperband, or {name: ..., <options of Optuna's pruner>}
        seed: the sampler's seed
        compare_with: an earlier sized lr grid to set beside this one's in the transfer table
    """

    name: str | None = None
    description: str | None = None
    sampler: Literal["grid", "random", "tpe"] = "grid"
    trials_per_variant: PositiveInt = 1
    space: dict[str, DimensionSpec] = field(default_factory=dict)
    pruner: str | dict[str, Any] | None = None
    seed: NonNegativeInt = 0
    compare_with: CompareWith | None = None


def load_search_spec(path: str | Path) -> SearchSpec:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--search: {str(path)!r} is not a file (search specs live in sweeps/)")
    raw = read_yaml_file(path, "--search") or {}
    spec = load_section(SearchFile, raw, "", what="search-spec key")
    pruner = {"name": spec.pruner} if isinstance(spec.pruner, str) else dict(spec.pruner or {"name": "none"})
    if pruner.get("name") not in PRUNERS:
        raise UserError(f"pruner.name: {pruner.get('name')!r} is not one of {', '.join(PRUNERS)}")
    dims = tuple(_dimension(key, dim, spec.sampler) for key, dim in spec.space.items())
    if spec.compare_with is not None and not Path(spec.compare_with.path).is_file():
        raise UserError(
            f"compare_with.path: {spec.compare_with.path!r} is not a file (an earlier grid's lr_sensitivity.csv, "
            "relative to the folder ablate runs in)"
        )
    name = (
        safe_name("name", spec.name)
        if spec.name is not None
        else safe_name(f"name (taken from the file name {path.name!r}; or set name:)", path.stem)
    )
    return SearchSpec(
        name=name,
        sampler=spec.sampler,
        trials_per_variant=spec.trials_per_variant,
        dimensions=dims,
        pruner=pruner,
        seed=spec.seed,
        compare_with=spec.compare_with,
    )


def _dimension(key: str, dim: DimensionSpec, sampler: str) -> Dimension:
    if not key.startswith("base."):
        raise UserError(f"space.{key}: searched keys are dotted recipe keys under base (like base.train.lr)")
    if dim.values is not None:
        if not dim.values:
            raise UserError(f"space.{key}.values: expected a non-empty list")
        return Dimension(key, values=tuple(dim.values))
    if sampler == "grid":
        raise UserError(f"space.{key}: the grid sampler needs a list of values, not a range")
    if dim.low is None or dim.high is None:
        raise UserError(f"space.{key}: a range needs numeric low and high")
    if not dim.low < dim.high or (dim.log and dim.low <= 0):
        raise UserError(f"space.{key}: need 0 < low < high for log ranges and low < high otherwise")
    return Dimension(key, low=dim.low, high=dim.high, log=dim.log, integer=dim.int)
