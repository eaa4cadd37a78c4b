"""The recipe file's schema, and the typed run it resolves into.

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
`TrainConfig`, `DataConfig`) and checked by jsonargparse when the recipe loads (ablate.recipe.loading).
A run the recipe resolves into (ablate.recipe.resolve) is a `RunSpec`: its typed sections, and the key that
identifies it across resumes.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from jsonargparse.typing import NonNegativeInt

from ablate.core.config import load_section
from ablate.core.errors import UserError, closest
from ablate.core.launcher import LauncherConfig
from ablate.data.config import DATA_KEYS_ADDED_LATER, DataConfig, parse_data_config
from ablate.model.config import MODEL_KEYS_ADDED_LATER, ModelConfig
from ablate.probes.config import EvalConfig
from ablate.recipe.budgets import Budgets
from ablate.recipe.matching import Tolerance
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


def how_computed(train: TrainConfig) -> tuple[str, ...]:
    """The `train:` keys that say how a run is computed, not which run it is: left out of its key, so its
    folder and checkpoints serve it however it is computed (docs/scaling-out.md). Activation checkpointing
    recomputes the same numbers. Under fsdp the ranks split the same global batch (`train.batch_tokens`)
    and a sharded checkpoint reshards to any number of them, so a run resumes on other devices or nodes;
    DDP's runs were keyed with their devices before fsdp existed, and keep those keys."""
    if train.strategy == "fsdp":
        return ("activation_checkpointing", "devices", "num_nodes")
    return ("activation_checkpointing",)


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
        without = (*without, *how_computed(self.train))
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


def check_variants(keys: Iterable[str], variants: dict[str, Any], key: str) -> None:
    """Each of `keys` a variant of the recipe, else one line naming `key` (the option or recipe key that
    listed it) and the variants there are."""
    for name in keys:
        if name not in variants:
            raise UserError(
                f"{key}: unknown variant {name!r}{closest(name, variants)}; variants: {', '.join(variants)}"
            )
