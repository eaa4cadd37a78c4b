"""Reading a recipe file: the YAML and the command line's overrides, checked into a `Recipe`.

`load_recipe` reads the file, applies the overrides (`base.*` ones are kept for `Recipe.resolve`, the
others set in the file's mapping), checks every key against the recipe's types (ablate.recipe.schema,
by jsonargparse) and what types cannot say (names that become folders, scales that change sizes only),
imports the recipe's `imports:` so their components register, and resolves the runs at the scale asked
for (ablate.recipe.resolve). Scale, size and variant keys and the name become folder names, so they are
refused unless they are safe file names (`config.safe_name`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from ablate.core import registry
from ablate.core.config import (
    COMPONENT_KEYS,
    YamlTooLarge,
    load_section,
    load_yaml,
    read_yaml_file,
    safe_name,
    set_dotted,
)
from ablate.core.errors import UserError, closest
from ablate.recipe.resolve import Recipe
from ablate.recipe.schema import IDENTIFIER, TOP_KEYS, RecipeFile, check_variants


def load_recipe(
    path: str | Path, overrides: Iterable[tuple[str, Any]] = (), *, scale: str | None = None
) -> Recipe:
    """Read and check a recipe file, and resolve its runs at `scale` (default: the recipe's default
    scale) into `recipe.runs`: a recipe that loads is valid there, and those typed runs travel from here
    on (every verb and a sweep's trials use them instead of resolving again). `overrides` are (dotted
    key, value) pairs from the command line."""
    path = Path(path)
    if not path.is_file():
        hint = (
            f"; recipes here: {', '.join(sorted(p.name for p in path.parent.glob('*.yaml')))}"
            if path.parent.is_dir()
            else ""
        )
        raise UserError(f"recipe: {str(path)!r} is not a file{hint}")
    raw = read_yaml_file(path, "recipe")
    if not isinstance(raw, dict):
        raise UserError(
            f"recipe: {path} must hold a mapping with base and variants, got {type(raw).__name__}"
        )
    base_overrides = []
    for dotted, value in overrides:
        if dotted.startswith("base."):
            base_overrides.append((dotted[len("base.") :], value))
        else:
            if dotted.split(".")[0] not in TOP_KEYS:
                top = dotted.split(".")[0]
                raise UserError(
                    f"--{dotted}: unknown recipe key {top!r}{closest(top, TOP_KEYS)}; "
                    f"keys: {', '.join(TOP_KEYS)}"
                )
            if dotted.startswith("launcher.") and dotted.count(".") >= 2:  # an optional section: made, so
                raw.setdefault("launcher", {}).setdefault(dotted.split(".")[1], {})  # its keys can be set
            if "." in dotted:
                set_dotted(raw, dotted, value, key=f"--{dotted}")
            else:
                raw[dotted] = value
    typed = _check_raw(raw)
    registry.load_plugins(typed.imports)
    name = (
        safe_name("name", typed.name)
        if typed.name is not None
        else safe_name(f"name (taken from the file name {path.name!r}; or set name:)", path.stem)
    )
    recipe = Recipe(path=path, name=name, raw=raw, file=typed, base_overrides=base_overrides)
    recipe.scale = scale or recipe.default_scale
    recipe.runs = recipe.resolve(recipe.scale)  # fail now, not in the middle of a sweep
    for i, probe in enumerate(recipe.eval().probes):
        registry.check_spec("probe", probe, key=f"eval.probes[{i}]")
    return recipe


def _check_raw(raw: dict[str, Any]) -> RecipeFile:
    """The recipe's types (jsonargparse), then what types cannot say: keys that become file names, the
    default scale among the scales, scales that change sizes only."""
    typed = load_section(RecipeFile, raw, "", what="recipe key")
    if not typed.variants:
        raise UserError("variants: required mapping of at least one variant")
    if not typed.seeds:
        raise UserError("seeds: expected a non-empty list of non-negative integers, got []")
    for key in typed.variants:
        if not IDENTIFIER.match(key):
            raise UserError(f"variants.{key}: variant keys must be identifiers (letters, digits, _)")
    scales = typed.scales or {}
    for name, overlay in scales.items():
        safe_name(f"scales.{name}", name)
        for size in overlay.sizes or {}:
            safe_name(f"scales.{name}.sizes.{size}", size)
        check_variants(overlay.variants or (), typed.variants, f"scales.{name}.variants")
        if overlay.variants is not None and not overlay.variants:
            raise UserError(
                f"scales.{name}.variants: an empty list trains nothing; omit it for every variant"
            )
        for component in COMPONENT_KEYS:
            if component in overlay.model:
                raise UserError(
                    f"scales.{name}.model.{component}: scales change sizes only; "
                    "choose components in base or variants"
                )
    for size in typed.sizes or {}:
        safe_name(f"sizes.{size}", size)
    known = sorted(set(scales) | {"paper"})
    if typed.default_scale not in known:
        bad = typed.default_scale
        raise UserError(
            f"default_scale: {bad!r} is not a scale of this recipe{closest(bad, known)}; "
            f"scales: {', '.join(known)}"
        )
    return typed


def parse_overrides(pairs: Iterable[str]) -> list[tuple[str, Any]]:
    """['--base.train.lr', '3e-4', ...] or ['base.train.lr=3e-4'] -> [(key, value)], values as YAML."""
    items = list(pairs)
    result = []
    i = 0
    while i < len(items):
        item = items[i]
        if not item.startswith("--") and "=" not in item:
            raise UserError(f"{item}: unexpected argument; overrides look like --base.train.lr 3e-4")
        key = item[2:] if item.startswith("--") else item
        if "=" in key:
            key, text = key.split("=", 1)
            i += 1
        else:
            if i + 1 >= len(items):
                raise UserError(f"--{key}: needs a value")
            text = items[i + 1]
            i += 2
        if not key or not all(IDENTIFIER.match(p) or p.isdigit() for p in key.split(".")):
            raise UserError(f"--{key}: not a dotted recipe key (like base.train.lr)")
        try:
            value = load_yaml(text)
        except yaml.YAMLError:
            value = text
        except YamlTooLarge as e:
            raise UserError(f"--{key}: the value is too large: {e}") from None
        result.append((key, value))
    return result
