"""A checked recipe (`Recipe`) resolved into its runs: its scales, sizes and overrides into `RunSpec`s.

A run's config is `base <- scale <- size <- variant <- the scale's train settings of that variant (a
`variants:` mapping) <- overrides on base.*`, merged key by key (a component spec that names another
component replaces the old one). Every run lists every key, checked against its section's type and every
component's options against its constructor (`registry.check_spec`): nothing is built. The recipe file's
types and `RunSpec` are in ablate.recipe.schema; reading and checking the file, in ablate.recipe.loading.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.core import registry
from ablate.core.config import COMPONENT_KEYS, deep_merge, load_section, set_dotted
from ablate.core.errors import UserError, closest
from ablate.data.config import DataConfig, parse_data_config
from ablate.data.task_batches import build_task, check_fits
from ablate.data.tokenizers import vocab_size_of
from ablate.model.config import ModelConfig
from ablate.probes.config import EvalConfig
from ablate.recipe.budgets import Budgets, budget_steps
from ablate.recipe.matching import Tolerance, solve_matches
from ablate.recipe.schema import (
    SECTIONS,
    RecipeFile,
    RunSpec,
    ScaleOverlay,
    Variant,
    check_variants,
    row_labels,
    sections_as_dict,
)
from ablate.train.config import TrainConfig


@dataclass
class Recipe:
    """A checked recipe file: its typed keys (`file`), and the mapping they came from (`raw`), whose
    free-form overlays `resolve` merges before checking each run's sections."""

    path: Path
    name: str
    raw: dict[str, Any]
    file: RecipeFile
    base_overrides: list[tuple[str, Any]] = field(default_factory=list)
    scale: str | None = None  # the scale `runs` are at (load_recipe's)
    runs: list[RunSpec] = field(default_factory=list)  # resolved by load_recipe: every variant x size x seed

    def runs_for(
        self, seeds: Iterable[int] | None = None, variants: Iterable[str] | None = None
    ) -> list[RunSpec]:
        """The loaded runs for `seeds` (any seeds: a seed changes no section, so the run is the loaded one
        with its seed replaced) and `variants` (default: all), in recipe order, without resolving again."""
        keys = list(dict.fromkeys(run.variant for run in self.runs)) if variants is None else list(variants)
        check_variants(keys, self.variants, "--variant")
        seeds = list(self.seeds if seeds is None else seeds)
        first = self.runs[0].seed
        sizes = list(dict.fromkeys(run.size for run in self.runs))
        return [
            dataclasses.replace(run, seed=int(seed))
            for size in sizes
            for key in keys
            for run in self.runs
            if run.variant == key and run.size == size and run.seed == first
            for seed in seeds
        ]

    @property
    def variants(self) -> dict[str, Variant]:
        return self.file.variants

    @property
    def row_labels(self) -> dict[str, str]:
        return row_labels(self.variants)

    @property
    def scales(self) -> list[str]:
        return sorted(set(self.file.scales or {}) | {"paper"})

    @property
    def default_scale(self) -> str:
        return self.file.default_scale

    @property
    def seeds(self) -> list[int]:
        return list(self.file.seeds)

    @property
    def tolerance(self) -> Tolerance:
        return self.file.tolerance

    def scale_overlay(self, scale: str) -> ScaleOverlay:
        return (self.file.scales or {}).get(scale) or ScaleOverlay()

    def scale_raw(self, scale: str) -> dict[str, Any]:
        """The mapping of `scale` as written (with the command line's overrides), whose free-form overlays
        are merged; {} for a scale that writes none."""
        return (self.raw.get("scales") or {}).get(scale) or {}

    def check_scale(self, scale: str) -> None:
        if scale not in (self.raw.get("scales") or {}) and scale != "paper":
            raise UserError(
                f"--scale: unknown scale {scale!r}{closest(scale, self.scales)}; "
                f"scales: {', '.join(self.scales)}"
            )

    def base_at(self, scale: str) -> dict[str, Any]:
        """The base sections with the scale's overlay merged in (before sizes, variants and overrides)."""
        return deep_merge(self.raw["base"], {k: v for k, v in self.scale_raw(scale).items() if k in SECTIONS})

    def eval(self, scale: str | None = None) -> EvalConfig:
        """The eval section at `scale` (the scale's `eval:` overlay on the recipe's)."""
        # From the mappings, typed here: the section is its scale's overlay merged onto the recipe's.
        overlay = self.scale_raw(scale or self.default_scale).get("eval") or {}
        return load_section(EvalConfig, deep_merge(self.raw.get("eval") or {}, overlay), "eval")

    def budgets(self, scale: str) -> Budgets | None:
        """The token budgets at `scale` (the scale's, else the recipe's), or None."""
        return self.scale_overlay(scale).budgets or self.file.budgets

    def scale_variants(self, scale: str) -> list[str]:
        """The rows trained at `scale`: the scale's `variants:` list, else every variant."""
        return list(self.scale_overlay(scale).variants or self.variants)

    def scale_variant_overlay(self, scale: str, variant: str) -> dict[str, Any]:
        """The scale's own settings of `variant` (a `variants:` mapping: {train: {...}}), else {}."""
        listed = self.scale_raw(scale).get("variants")
        entry = (listed.get(variant) or {}) if isinstance(listed, dict) else {}
        return {s: entry[s] for s in SECTIONS if entry.get(s)}

    def sizes(self, scale: str) -> dict[str, dict[str, Any]] | None:
        return self.scale_raw(scale).get("sizes", self.raw.get("sizes"))

    def resolve(
        self,
        scale: str | None = None,
        seeds: Iterable[int] | None = None,
        variants: Iterable[str] | None = None,
    ) -> list[RunSpec]:
        """Every run of this recipe at `scale`: variants x sizes x seeds, in recipe order.

        The one place a recipe becomes runs: each variant's merged sections are checked into their types
        and `match:` knobs are solved, so callers resolve once and pass the runs on (a sweep resolves once
        per searched point, `ablate.store.study.SweepContext.runs`)."""
        scale = scale or self.default_scale
        self.check_scale(scale)
        seeds = list(self.seeds if seeds is None else seeds)
        keys = self.scale_variants(scale) if variants is None else list(variants)
        check_variants(keys, self.variants, "--variant")
        budgets = self.budgets(scale)
        base = self.base_at(scale)
        sizes = self.sizes(scale) or {None: {}}
        runs = []
        for size, size_overlay in sizes.items():
            typed: dict[str, tuple[ModelConfig, TrainConfig, DataConfig]] = {}
            for key in self.variants:  # every variant: `match:` solves against the first
                variant = self.raw["variants"][key]
                overlay = {s: variant[s] for s in SECTIONS if s in variant}
                config = deep_merge(deep_merge(base, size_overlay or {}), overlay)
                config = deep_merge(config, self.scale_variant_overlay(scale, key))
                for path, value in self.base_overrides:
                    set_dotted(config, path, value, key=f"base.{path}")
                where = f"variants.{key}" + (f", size {size}" if size else "")
                try:
                    typed[key] = _complete(config, where=where)
                except UserError as e:
                    if str(e).split(":", 1)[0] in {path for path, _ in self.base_overrides}:
                        raise UserError(f"--base.{e}") from None  # the user's flag, wrong for every row
                    raise UserError(f"{e} (in {where})") from None
            configs = {key: sections_as_dict(*sections) for key, sections in typed.items()}
            solved = solve_matches(configs, self.raw["variants"], dataclasses.asdict(self.tolerance))
            for key in keys:
                model, train, data = typed[key]
                steps: tuple[int, ...] = ()
                if budgets is not None:  # the longest budget is the run's length (ablate.recipe.budgets)
                    where = (
                        "budgets" if self.scale_overlay(scale).budgets is None else f"scales.{scale}.budgets"
                    )
                    steps = budget_steps(budgets, train, key=where)
                    train = dataclasses.replace(train, steps=steps[-1])
                if solved[key] is not configs[key]:  # a `match:` knob was solved (ablate.recipe.matching)
                    model = ModelConfig.from_dict(solved[key]["model"])
                label = self.row_labels[key]  # Table 6's two "Transformer" rows: told apart everywhere
                for seed in seeds:
                    runs.append(
                        RunSpec(
                            self.name,
                            key,
                            label,
                            scale,
                            int(seed),
                            size,
                            model,
                            train,
                            data,
                            self.variants[key].paper,
                            steps,
                        )
                    )
        return runs


def _complete(config: dict[str, Any], where: str) -> tuple[ModelConfig, TrainConfig, DataConfig]:
    """Check a merged config against the section types and every component's constructor: the typed
    sections, every default written out. Nothing is built."""
    unknown = sorted(set(config) - set(SECTIONS))
    if unknown:
        raise UserError(f"base.{unknown[0]}: unknown section; sections: {', '.join(SECTIONS)}")
    model = ModelConfig.from_dict(config["model"])
    for kind in COMPONENT_KEYS:
        registry.check_spec(kind, getattr(model, kind), key=f"model.{kind}")
    train = load_section(TrainConfig, config["train"], "train")
    data = parse_data_config(config["data"])
    if data.tokenizer and data.tokenizer["name"] == "hf":  # a local file: its vocabulary is known now
        need = vocab_size_of(data.tokenizer)
        if model.vocab_size < need:
            raise UserError(
                f"model.vocab_size: {model.vocab_size} is smaller than the vocabulary of "
                f"{data.tokenizer['path']} ({need} tokens); set model.vocab_size >= {need}"
            )
    if data.task is not None:  # built now (cheap): its own value checks and its fit run before any training
        registry.check_spec("task", data.task, key="data.task")
        check_fits(build_task(data), seq_len=train.seq_len, vocab_size=model.vocab_size)
    return model, train, data


def resolved_recipe(recipe: Recipe, scale: str | None = None) -> dict[str, Any]:
    """`recipe` at `scale` with its overrides applied, as a recipe file that resolves to the same runs.

    Without a sizes axis every variant lists its complete, resolved model/train/data sections (what the
    run will use, every default written out); with one, the sizes stay overlays and each variant its
    overlay with the command line's base.* overrides written into it (they apply after the size)."""
    scale = scale or recipe.scale or recipe.default_scale
    runs = (
        recipe.runs_for(recipe.seeds[:1])
        if scale == recipe.scale
        else recipe.resolve(scale, recipe.seeds[:1])
    )
    raw = recipe.raw
    base = recipe.base_at(scale)
    for path, value in recipe.base_overrides:
        set_dotted(base, path, value, key=f"base.{path}")
    sizes = recipe.sizes(scale)
    variants: dict[str, Any] = {}
    # a scale's `variants:` may pick some of the recipe's, in its own order (the first is the reference)
    for key in dict.fromkeys(r.variant for r in runs):
        variant = raw["variants"][key]
        entry = {k: v for k, v in variant.items() if k not in SECTIONS}
        if sizes:  # the scale's settings of this row (applied after the variant's) written into its overlay
            mine = recipe.scale_variant_overlay(scale, key)
            overlay = {s: deep_merge(dict(variant.get(s) or {}), mine.get(s) or {}) for s in SECTIONS}
            for path, value in recipe.base_overrides:
                section, _, rest = path.partition(".")
                if rest:
                    overlay[section] = deep_merge(overlay[section], _nested(rest, value))
            entry.update({s: o for s, o in overlay.items() if o})
        else:
            (run,) = [r for r in runs if r.variant == key]
            entry.update(run.config)
        variants[key] = entry
    out: dict[str, Any] = {"name": recipe.name}
    for top in ("description", "imports", "paper_reference"):
        if raw.get(top) is not None:
            out[top] = raw[top]
    out.update(
        {
            "tolerance": dataclasses.asdict(recipe.tolerance),
            "seeds": recipe.seeds,
            "default_scale": scale,
            "eval": dataclasses.asdict(recipe.eval(scale)),
            "base": base,
            "variants": variants,
        }
    )
    if sizes:
        out["sizes"] = sizes
    if raw.get("launcher"):  # where the workers run: kept as resolved (ablate.core.launcher)
        out["launcher"] = dataclasses.asdict(recipe.file.launcher)
    budgets = recipe.budgets(scale)
    if budgets is not None:  # every budget a branch of the longest run (ablate.recipe.budgets)
        out["budgets"] = dataclasses.asdict(budgets)
    if scale != "paper":
        out["scales"] = {scale: {}}
    return out


def _nested(dotted: str, value: Any) -> dict[str, Any]:
    """'a.b.c', v -> {a: {b: {c: v}}}."""
    node: Any = value
    for part in reversed(dotted.split(".")):
        node = {part: node}
    return node
