"""YAML recipe -> validated `Recipe` -> fully resolved `RunSpec`s.

A recipe file:

    name: table6                 # default: the file name; a safe file name (it names folders)
    description: ...
    imports: [my_pkg.my_attn]    # modules to import first, so plugins register
    tolerance: {params: 0.02, flops: 0.02}
    seeds: [0]
    default_scale: paper
    base: {model: {...}, train: {...}, data: {...}}
    variants:                    # identifiers; each a label and an overlay on base
      transformer: {label: Transformer, model: {attention: {name: softmax}}}
      # a variant may name `match: model.<key>`: a knob solved so the variant matches the first row's budget
    sizes: {...}                 # optional second axis (scaling grids): name -> overlay on base
    scales:                      # presets that change sizes only: an overlay on base (and may replace sizes)
      tiny: {model: {d_model: 256, ...}, train: {...}, eval: {tokens: 8192}}
    eval: {probes: [outliers, quantization], tokens: 409600, checkpoint: best, after_trial: false}

Every key is typed (`RecipeFile` and the dataclasses it holds; model/train/data are `ModelConfig`,
`TrainConfig`, `DataConfig`) and checked by jsonargparse when the recipe loads, with every component's
options checked against its constructor (`registry.check_spec`): nothing is built before the recipe is
known to be valid. Scale, size and variant keys and the name become folder names, so they are refused
unless they are safe file names (`config.safe_name`).

A run's config is `base <- scale <- size <- variant <- the scale's train settings of that variant (a
`variants:` mapping) <- overrides on base.*`, merged key by key (a component spec that names another
component replaces the old one). Every run lists every key.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from jsonargparse.typing import NonNegativeInt

from ablate.core import registry
from ablate.core.config import (
    COMPONENT_KEYS,
    YamlTooLarge,
    deep_merge,
    load_section,
    load_yaml,
    read_yaml_file,
    safe_name,
    set_dotted,
)
from ablate.core.errors import UserError, closest
from ablate.core.launcher import LauncherConfig
from ablate.data.config import DATA_KEYS_ADDED_LATER, DataConfig, parse_data_config
from ablate.data.task_batches import build_task, check_fits
from ablate.data.tokenizers import vocab_size_of
from ablate.model.config import MODEL_KEYS_ADDED_LATER, ModelConfig
from ablate.probes.config import EvalConfig
from ablate.recipe.budgets import Budgets, budget_steps
from ablate.recipe.matching import Tolerance, solve_matches
from ablate.train.config import TRAIN_KEYS_ADDED_LATER, TRAIN_VALUES_KEYED_AS, TrainConfig

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SECTIONS = ("model", "train", "data")


# --- the recipe file's types (jsonargparse checks every value against them) ------------------------------
@dataclass(frozen=True)
class Variant:
    """One row of the study: a label and an overlay on base.

    Attributes:
        label: the row's text in tables
        description: what the variant changes
        paper: the paper's numbers for this row ({metric: value}), printed beside ours
        model: overlay on base.model
        train: overlay on base.train
        data: overlay on base.data
        match: a dotted model key solved so that this variant matches the first row's budget
        match_on: what `match` equalises: params, or flops (forward FLOPs per token)
    """

    label: str
    description: str | None = None
    paper: dict[str, float] | None = None
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    match: str | None = None
    match_on: Literal["params", "flops"] = "params"


@dataclass(frozen=True)
class SizeOverlay:
    """One size of a scaling grid: an overlay on base.

    Attributes:
        model: overlay on base.model (sizes only: d_model, n_layers, head_dim, ...)
        train: overlay on base.train
        data: overlay on base.data
    """

    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ScaleVariant:
    """A row at one scale: its training settings there, over the variant's own (e.g. each row its own lr).

    Attributes:
        train: overlay on the row's train section at this scale (after the size's and the variant's)
    """

    train: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ScaleOverlay:
    """A scale preset: an overlay on base that changes sizes only (and may replace the sizes axis).

    Attributes:
        model: overlay on base.model (no component choices)
        train: overlay on base.train
        data: overlay on base.data
        eval: overlay on the eval section
        sizes: the sizes axis at this scale, instead of the recipe's
        budgets: the token budgets at this scale, instead of the recipe's (ablate.recipe.budgets)
        variants: the rows trained at this scale (default: every variant; the first is the reference): a
            list, or a mapping of each row to its train settings at this scale ({diff: {train: {lr: ...}}})
        purpose: what this scale is for, one sentence; reports print it (a tiny scale: "a pipeline check")
    """

    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    eval: dict[str, Any] = field(default_factory=dict)
    sizes: dict[str, SizeOverlay] | None = None
    budgets: Budgets | None = None
    variants: list[str] | dict[str, ScaleVariant] | None = None
    purpose: str | None = None


@dataclass(frozen=True)
class Base:
    """The recipe's base sections, shared by every variant.

    Attributes:
        model: the model section (see ablate.model.config.ModelConfig)
        train: the train section (see ablate.train.config.TrainConfig)
        data: the data section (see ablate.data.config.DataConfig); null: every default
    """

    model: dict[str, Any] = field(metadata={"missing": "required section missing"})
    train: dict[str, Any] = field(metadata={"missing": "required section missing"})
    data: dict[str, Any] | None = field(metadata={"missing": "required section missing"})


@dataclass(frozen=True, kw_only=True)
class RecipeFile:
    """A recipe file, every top-level key.

    Attributes:
        name: the recipe's name in runs, studies and report folders (default: the file name)
        description: what the study asks
        imports: modules to import first, so their components register
        tolerance: how far a variant's params and FLOPs may be from the first row's
        seeds: seeds every variant runs with (paired: seed k gives every variant the same data order)
        default_scale: the scale used without --scale
        base: model, train and data sections shared by every variant
        variants: the rows, each an overlay on base
        sizes: a second axis (scaling grids): size name -> overlay on base
        budgets: token budgets every row is trained to from one run (ablate.recipe.budgets)
        scales: presets (paper, small, tiny, ...): overlays on base that change sizes only
        eval: the probes run on finished checkpoints
        launcher: where a sweep's workers run (local, slurm) and the Slurm options (ablate.core.launcher)
        paper_reference: where in the paper the study comes from
    """

    name: str | None = None
    description: str | None = None
    imports: list[str] = field(default_factory=list)
    tolerance: Tolerance = field(default_factory=Tolerance)
    seeds: list[NonNegativeInt] = field(default_factory=lambda: [0])
    default_scale: str = "paper"
    base: Base = field(metadata={"missing": "required mapping with model, train and data"})
    variants: dict[str, Variant] = field(metadata={"missing": "required mapping of at least one variant"})
    sizes: dict[str, SizeOverlay] | None = None
    budgets: Budgets | None = None
    scales: dict[str, ScaleOverlay] | None = None
    eval: EvalConfig = field(default_factory=EvalConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    paper_reference: dict[str, Any] | None = None


TOP_KEYS = tuple(f.name for f in dataclasses.fields(RecipeFile))
VARIANT_KEYS = tuple(f.name for f in dataclasses.fields(Variant))


@dataclass(frozen=True, eq=False)
class RunSpec:
    """One fully resolved training run: everything needed to reproduce it, nothing implicit.

    Its sections are the typed ones the recipe was checked into (`ModelConfig`, `TrainConfig`,
    `DataConfig`); `config` is the same three as plain mappings, for the run key, MLflow params and the
    resolved-recipe artifact.
    """

    recipe: str
    variant: str
    label: str
    scale: str
    seed: int
    size: str | None
    model: ModelConfig
    train: TrainConfig
    data: DataConfig
    paper: dict[str, float] | None = None
    budgets: tuple[int, ...] = ()  # steps of every budget, the last = train.steps (not part of the key)

    @property
    def name(self) -> str:
        size = f"-{self.size}" if self.size else ""
        return f"{self.variant}{size}-s{self.seed}"

    @functools.cached_property
    def config(self) -> dict[str, Any]:
        """{"model": ..., "train": ..., "data": ...}, every key present, as a recipe file writes them."""
        return sections_as_dict(self.model, self.train, self.data)

    @functools.cached_property
    def key(self) -> str:
        """A stable hash of everything that defines the run (its identity across resumes)."""
        return self.identity()

    def identity(self, *, without: tuple[str, ...] = ()) -> str:
        """The hash behind `key`, with the `train` keys in `without` left out (`stable_key`: runs that
        differ only in their length share their stable phase)."""
        train = {
            k: TRAIN_VALUES_KEYED_AS[k].get(v, v) if k in TRAIN_VALUES_KEYED_AS else v
            for k, v in self.config["train"].items()
            if k not in without and (k not in TRAIN_KEYS_ADDED_LATER or v != TRAIN_KEYS_ADDED_LATER[k])
        }  # keys added later count only away from their defaults, a new default as the old (ablate.train.config)
        data = {  # repeat: a permission, not the data; keys added later count only away from earlier runs' value
            k: v
            for k, v in self.config["data"].items()
            if k != "repeat" and (k not in DATA_KEYS_ADDED_LATER or v != DATA_KEYS_ADDED_LATER[k])
        }
        model = {
            k: v
            for k, v in self.config["model"].items()
            if k not in MODEL_KEYS_ADDED_LATER or v != MODEL_KEYS_ADDED_LATER[k]
        }
        ident = {
            "recipe": self.recipe,
            "variant": self.variant,
            "scale": self.scale,
            "seed": self.seed,
            "size": self.size,
            "config": {**self.config, "model": model, "train": train, "data": data},
        }
        return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunSpec) and other.key == self.key

    def at_budget(self, steps: int) -> RunSpec:
        """This run trained to `steps` instead: the run of one budget (its own key, no budgets)."""
        return dataclasses.replace(self, train=dataclasses.replace(self.train, steps=steps), budgets=())

    def branches(self) -> list[RunSpec]:
        """The runs of the smaller budgets, shortest first; each branches off this run at its
        `train.cooldown_start` (ablate.train.branches)."""
        return [self.at_budget(steps) for steps in self.budgets if steps < self.train.steps]

    def to_json(self) -> dict[str, Any]:
        """What `from_json` reads back (a rank process gets its run this way)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**{k: v for k, v in fields.items() if k not in SECTIONS}, **self.config}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> RunSpec:
        sections = {
            "model": ModelConfig.from_dict(raw["model"]),
            "train": load_section(TrainConfig, raw["train"], "train"),
            "data": parse_data_config(raw["data"]),
        }
        rest = {k: v for k, v in raw.items() if k not in SECTIONS}
        rest["budgets"] = tuple(rest.get("budgets", ()))
        return cls(**rest, **sections)


def row_labels(variants: dict[str, Any]) -> dict[str, str]:
    """Variant -> its label, with the variant key added where two rows share a label (Table 6 has two
    'Transformer' rows), so legends and tables tell them apart."""
    labels = {k: v.label for k, v in variants.items()}
    counts = {label: list(labels.values()).count(label) for label in labels.values()}
    return {k: label if counts[label] == 1 else f"{label} [{k}]" for k, label in labels.items()}


def sections_as_dict(model: ModelConfig, train: TrainConfig, data: DataConfig) -> dict[str, Any]:
    return {
        "model": model.to_dict(),
        "train": {k: (list(v) if isinstance(v, tuple) else v) for k, v in train.__dict__.items()},
        "data": dataclasses.asdict(data),
    }


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
        for key in keys:
            if key not in self.variants:
                raise UserError(
                    f"--variant: unknown variant {key!r}{closest(key, self.variants)}; "
                    f"variants: {', '.join(self.variants)}"
                )
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

    def eval(self, scale: str | None = None) -> EvalConfig:
        """The eval section at `scale` (the scale's `eval:` overlay on the recipe's)."""
        # From the mappings, typed here: the section is its scale's overlay merged onto the recipe's.
        overlay = ((self.raw.get("scales") or {}).get(scale or self.default_scale) or {}).get("eval") or {}
        return load_section(EvalConfig, deep_merge(self.raw.get("eval") or {}, overlay), "eval")

    def budgets(self, scale: str) -> Budgets | None:
        """The token budgets at `scale` (the scale's, else the recipe's), or None."""
        return self.scale_overlay(scale).budgets or self.file.budgets

    def scale_variants(self, scale: str) -> list[str]:
        """The rows trained at `scale`: the scale's `variants:` list, else every variant."""
        return list(self.scale_overlay(scale).variants or self.variants)

    def scale_variant_overlay(self, scale: str, variant: str) -> dict[str, Any]:
        """The scale's own settings of `variant` (a `variants:` mapping: {train: {...}}), else {}."""
        listed = ((self.raw.get("scales") or {}).get(scale) or {}).get("variants")
        entry = (listed.get(variant) or {}) if isinstance(listed, dict) else {}
        return {s: entry[s] for s in SECTIONS if entry.get(s)}

    def sizes(self, scale: str) -> dict[str, dict[str, Any]] | None:
        overlay = (self.raw.get("scales") or {}).get(scale) or {}
        return overlay.get("sizes", self.raw.get("sizes"))

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
        scales = self.raw.get("scales") or {}
        if scale not in scales and scale != "paper":
            raise UserError(
                f"--scale: unknown scale {scale!r}{closest(scale, self.scales)}; "
                f"scales: {', '.join(self.scales)}"
            )
        seeds = list(self.seeds if seeds is None else seeds)
        keys = self.scale_variants(scale) if variants is None else list(variants)
        for key in keys:
            if key not in self.variants:
                raise UserError(
                    f"--variant: unknown variant {key!r}{closest(key, self.variants)}; "
                    f"variants: {', '.join(self.variants)}"
                )
        budgets = self.budgets(scale)
        scale_overlay = {k: v for k, v in (scales.get(scale) or {}).items() if k in SECTIONS}
        base = deep_merge(self.raw["base"], scale_overlay)
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
        for key in overlay.variants or ():
            if key not in typed.variants:
                raise UserError(
                    f"scales.{name}.variants: unknown variant {key!r}{closest(key, typed.variants)}; "
                    f"variants: {', '.join(typed.variants)}"
                )
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
    scale_overlay = {k: v for k, v in ((raw.get("scales") or {}).get(scale) or {}).items() if k in SECTIONS}
    base = deep_merge(raw["base"], scale_overlay)
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
