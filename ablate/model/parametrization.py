"""`model.parametrization`: standard, or the maximal update parametrization (μP) with an optional depth rule.

Why our own and not the `mup` package: its rules hang on shapes found by comparing two models and on
replacement layers (MuReadout, MuAdam); here each component declares its parameters' roles in the
component contract (`ablate.core.contract.parameter_roles`), so a user's new variant gets μP by declaring
them, and the rules below are a few lines that a test recomputes in float64.

`standard` (the default) is the model and optimiser as they always were: `DecoderLM.reset_parameters`'s
rule, AdamW with two groups (weight decay on every parameter of 2 or more dimensions, none on the rest),
no multipliers. Nothing below runs for it.

`mup` (recipe: `parametrization: {name: mup, base_d_model: 128, base_head_dim: 32, base_n_layers: 4,
depth: completep}`): the recipe's lr, init_std, weight decay and eps are those of the BASE model (the
width and depth they were tuned at); at the base shape μP computes exactly what `standard` computes. At
another width, with m = fan_in / (the same parameter's fan_in in the base model), m_N = d_model /
base_d_model, m_d = head_dim / base_head_dim, m_L = n_layers / base_n_layers (1 without a depth rule),
σ = init_std, η = lr, λ = weight_decay, ε = eps:

| role (contract)       | init std          | Adam lr | AdamW weight decay | Adam eps             | multiplier       |
|-----------------------|-------------------|---------|--------------------|----------------------|------------------|
| input (embedding)     | σ                 | η       | λ                  | ε / m_N              | -                |
| hidden                | σ / sqrt(m)       | η / m   | λ m                | ε / m_N (/ m_L)      | -                |
| output (in a block)   | σ / m             | η / m   | λ m                | ε / m_N (/ m_L)      | -                |
| vector (gains, λ, ...)| the model's rule  | η       | 0                  | ε / m_N (/ m_L)      | -                |
| the LM head           | σ                 | η       | λ                  | ε / m_N              | logits: 1 / m_N  |

- hidden and input: Tensor Programs V (Yang et al. 2022, arXiv 2203.03466) Table 3 for Adam (init var
  1/fan_in, Adam lr 1/fan_in for hidden weights; input weights constant), written relative to the base
  model as the reference code does (microsoft/mup: `MuAdam` divides the lr of matrix-like parameters by
  their fan-in ratio and leaves vector-like ones alone).
- the LM head: Table 8's form (constant init variance and Adam lr, output multiplier 1/fan_in), the
  reference code's `MuReadout` (output_mult / width_mult on its input): it is the one form that lets the
  head share its matrix with the embedding (`tie_embeddings`). The multiplier scales the final norm's
  output, so the logits are lm_head(x) / m_N.
- output-like parameters inside a component: Table 3's form (init var 1/fan_in^2, Adam lr 1/fan_in),
  which needs nothing from the component's forward.
- vectors: Adam lr constant (Table 3's "all biases" column, the reference's vector-like rule); the init
  is the model's (norm gains ones, λ vectors Normal(0, lambda_std)) and they are not decayed, as under
  `standard`.
- weight decay: AdamW's decoupled decay is lr x λ per step; λ m keeps that product, and so the decay's
  time scale, the same at every width (the reference code's `MuAdamW`: weight_decay *= width_mult;
  CompleteP, arXiv 2505.01618, Table 1).
- eps: Adam's ε scales like the gradients, 1/m_N (and 1/m_L inside the blocks under the depth rule):
  CompleteP Table 1 / Eq. 40 and its reference implementation.
- attention: logits Q K^T / d instead of / sqrt(d) (Tensor Programs V, Section 4 / Appendix on
  attention: queries and keys become correlated in training, so their dot grows like d), written
  sqrt(d_base) / d so that the base model is unchanged; components apply it through the injected
  `head_ratio` = m_d (contract). Diff: both sub-maps' logits take the same rule (each is a softmax over
  the products of width-d sub-heads), and λ's re-parametrisation exp(λq·λk) is an inner product of two
  learned width-d vectors: it takes the multiplier 1/m_d (Table 8's 1/fan_in of a readout), so λ's
  change per step does not grow with d. The per-head norm's gains are vectors; (1 - λ_init) is a fixed
  number and does not change with width (docs/parametrization.md).
- depth (`depth: completep`): each residual branch is multiplied by 1/m_L (CompleteP, arXiv 2505.01618,
  α = 1: x + m_L^-α F(x)); its lr correction m_L^(α-1) is 1 at α = 1, so only the multiplier and ε change.
  The GPT-2 init of non-zero residual outputs (σ / sqrt(2 n_layers)) is then taken at the base depth.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ablate.core import contract
from ablate.core.errors import UserError

KEY = "model.parametrization"
NAMES = ("standard", "mup")
DEPTH_RULES = ("none", "completep")
LM_HEAD = "lm_head.weight"
# The recipe key of each part of the model, for the one line that refuses an undeclared parameter.
PART_KEYS = {
    "attention": "model.attention",
    "ffn": "model.ffn",
    "attn_norm": "model.norm",
    "ffn_norm": "model.norm",
}


@dataclass(frozen=True)
class Parametrization:
    """`model.parametrization` checked: `standard`, or `mup` with the base shape its hyperparameters were
    tuned at (base_head_dim and base_n_layers default to the model's own: width grows by heads, depth fixed)."""

    name: str = "standard"
    base_d_model: int | None = None
    base_head_dim: int | None = None
    base_n_layers: int | None = None
    depth: str = "none"

    @property
    def mup(self) -> bool:
        return self.name == "mup"


MAX_BASE = 1 << 20  # a base width, head dim or depth past this is a typo, not a model one tuned at


def parse(spec: Any, *, d_model: int, head_dim: int, n_layers: int) -> Parametrization:
    """`standard`, `mup` or {name: mup, base_d_model: ..., ...} -> a checked `Parametrization` (one line on a mistake)."""
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, Mapping):
        raise UserError(f"{KEY}: expected standard, mup or a mapping with name: mup, got {spec!r}")
    fields = {f.name for f in dataclasses.fields(Parametrization)}
    unknown = sorted(set(spec) - fields)
    if unknown:
        raise UserError(f"{KEY}.{unknown[0]}: unknown key; allowed: {', '.join(sorted(fields))}")
    name = spec.get("name", "standard")
    if name not in NAMES:
        raise UserError(f"{KEY}.name: {name!r} is not one of {', '.join(NAMES)}")
    if name == "standard":
        extra = sorted(k for k in spec if k != "name")
        if extra:
            raise UserError(f"{KEY}.{extra[0]}: only mup takes a base shape")
        return Parametrization()
    if "base_d_model" not in spec:
        raise UserError(f"{KEY}.base_d_model: mup needs the width its hyperparameters were tuned at")
    base = {
        "base_d_model": spec["base_d_model"],
        "base_head_dim": spec.get("base_head_dim", head_dim),
        "base_n_layers": spec.get("base_n_layers", n_layers),
    }
    for key, value in base.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BASE:
            raise UserError(f"{KEY}.{key}: expected an integer from 1 to {MAX_BASE:,}, got {value!r}")
    if base["base_d_model"] % base["base_head_dim"]:
        h = base["base_head_dim"]
        raise UserError(
            f"{KEY}.base_d_model: {base['base_d_model']} is not a multiple of base_head_dim {h} (the base "
            f"model's heads must fill its width); allowed: {h}, {2 * h}, {3 * h}, ... up to {MAX_BASE:,}"
        )
    depth = spec.get("depth", "none")
    if depth not in DEPTH_RULES:
        raise UserError(f"{KEY}.depth: {depth!r} is not one of {', '.join(DEPTH_RULES)}")
    return Parametrization(name="mup", depth=depth, **base)


def as_spec(p: Parametrization) -> Any:
    """What the recipe writes: "standard", or the mapping with every key (the run's record)."""
    return "standard" if not p.mup else dataclasses.asdict(p)


@dataclass(frozen=True)
class Multipliers:
    """The forward's width and depth multipliers (all 1.0 under standard)."""

    output: float = 1.0  # on the final norm's output, before the LM head: 1 / m_N
    branch: float = 1.0  # on every residual branch: 1 / m_L under the depth rule
    head_ratio: float = 1.0  # m_d, injected into attentions


STANDARD = Multipliers()


def multipliers(p: Parametrization, *, d_model: int, head_dim: int, n_layers: int) -> Multipliers:
    if not p.mup:
        return STANDARD
    branch = p.base_n_layers / n_layers if p.depth == "completep" else 1.0
    return Multipliers(output=p.base_d_model / d_model, branch=branch, head_ratio=head_dim / p.base_head_dim)


@dataclass(frozen=True)
class Rule:
    """What μP does to one parameter: its role, fan-in ratio m, and its init, lr, decay and eps factors
    (init and lr relative to the recipe's init_std and lr; weight decay and eps absolute)."""

    role: str
    ratio: float
    init: float  # times the std `standard` would draw it with (1.0 for vectors: the model's own rule)
    lr: float  # times the recipe's lr
    weight_decay: float
    eps: float


def roles(model: nn.Module) -> dict[str, str]:
    """Every parameter's role (full name -> role): the model's own (embedding, LM head) and what each
    component declares; an undeclared parameter is one UserError line naming the component, the parameter
    and what to declare. Of parameters declared at several levels, the innermost declaration counts."""
    found: dict[str, tuple[int, str]] = {}
    for prefix, module in model.named_modules():
        depth = prefix.count(".") + bool(prefix)
        for local, role in contract.parameter_roles(module).items():
            name = f"{prefix}.{local}" if prefix else local
            if role not in contract.ROLES:
                raise UserError(
                    f"{_key(prefix)}: {type(module).__qualname__}.parameter_roles[{local!r}] is {role!r}; "
                    f"a role is one of {', '.join(contract.ROLES)}"
                )
            if name not in found or found[name][0] < depth:
                found[name] = (depth, role)
    out = {}
    for name, _ in model.named_parameters():
        if name not in found:
            owner_path, local = _owner(model, name)
            owner = model.get_submodule(owner_path) if owner_path else model
            raise UserError(
                f"{_key(owner_path)}: {type(owner).__qualname__} does not declare parameter {local!r} "
                f"({name}) for {KEY} mup; add it to {type(owner).__qualname__}.parameter_roles as one of "
                f"{', '.join(contract.ROLES)} (ablate.core.contract)"
            )
        out[name] = found[name][1]
    return out


@dataclass(frozen=True)
class Basis:
    """What the rules read of a model: every parameter's role and its shape in the base model."""

    roles: dict[str, str]
    base_shapes: dict[str, tuple[int, ...]]


def basis(model: nn.Module, p: Parametrization) -> Basis:
    """`model`'s `Basis` under `p` (mup): its declared roles, and the base model built once on `meta`."""
    return Basis(roles(model), {n: tuple(t.shape) for n, t in base_model(model, p).named_parameters()})


def rules(model: nn.Module, found: Basis, p: Parametrization, *, eps: float) -> dict[str, Rule]:
    """Every parameter's `Rule` under `p` (mup), from its declared role and its fan-in against the base
    model's (`found`: `basis(model, p)`, which a `DecoderLM` keeps as `mup_basis`)."""
    cfg = model.config
    m_n = cfg.d_model / p.base_d_model
    m_l = cfg.n_layers / p.base_n_layers if p.depth == "completep" else 1.0
    base_shapes = found.base_shapes
    out = {}
    for name, role in found.roles.items():
        shape = tuple(model.get_parameter(name).shape)
        ratio = _fan_in(shape) / _fan_in(base_shapes[name]) if name in base_shapes else 1.0
        in_block = name.startswith("blocks.")
        group_eps = eps / m_n / (m_l if in_block else 1.0)
        if name == LM_HEAD:  # Table 8: the output multiplier carries the 1/m (a tied head is the embedding)
            rule = Rule(role, ratio, 1.0, 1.0, 1.0, eps / m_n)
        elif role == contract.INPUT:
            rule = Rule(role, ratio, 1.0, 1.0, 1.0, group_eps)
        elif role == contract.HIDDEN:
            rule = Rule(role, ratio, 1 / math.sqrt(ratio), 1 / ratio, ratio, group_eps)
        elif role == contract.OUTPUT:
            rule = Rule(role, ratio, 1 / ratio, 1 / ratio, ratio, group_eps)
        else:
            rule = Rule(role, ratio, 1.0, 1.0, 0.0, group_eps)
        out[name] = rule
    return out


def base_model(model: nn.Module, p: Parametrization) -> nn.Module:
    """`model`'s config at the base width (same depth), built on `meta` by the model's own class: only its
    shapes are read."""
    cfg = dataclasses.replace(model.config, d_model=p.base_d_model, head_dim=p.base_head_dim)
    try:
        with torch.device("meta"):
            return type(model)(cfg)
    except UserError as e:
        raise UserError(
            f"{KEY}: the base model (d_model {p.base_d_model}, head_dim {p.base_head_dim}) cannot be built: {e}"
        ) from None
    except Exception as e:  # noqa: BLE001 -- a component refusing the base width is the recipe's, not a bug
        raise UserError(
            f"{KEY}.base_d_model: the base model (d_model {p.base_d_model}, head_dim {p.base_head_dim}) cannot "
            f"be built: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; choose a base shape "
            "every component of the model accepts"
        ) from None


def param_groups(model: nn.Module, *, lr: float, weight_decay: float, eps: float) -> list[dict[str, Any]]:
    """AdamW's parameter groups. Standard: exactly the two groups training always used (decay on every
    parameter of 2+ dimensions, none on the rest; lr and eps from the optimiser's defaults). mup: one
    group per distinct (lr, weight decay, eps) of `rules`, the recipe's lr's group first (the logged lr)."""
    p = model.parametrization
    if not p.mup:
        decay = [q for q in model.parameters() if q.ndim >= 2]
        no_decay = [q for q in model.parameters() if q.ndim < 2]
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    found = rules(model, model.mup_basis, p, eps=eps)
    groups: dict[tuple[float, float, float], dict[str, Any]] = {}
    for name, param in model.named_parameters():
        r = found[name]
        key = (lr * r.lr, weight_decay * r.weight_decay, r.eps)
        group = groups.setdefault(
            key, {"params": [], "param_names": [], "lr": key[0], "weight_decay": key[1], "eps": key[2]}
        )
        group["params"].append(param)
        group["param_names"].append(name)
    return sorted(groups.values(), key=lambda g: (g["lr"] != lr, -g["lr"], g["param_names"][0]))


def _fan_in(shape: tuple[int, ...]) -> int:
    """PyTorch's fan-in: the product of every dimension after the first (a vector's own length)."""
    return math.prod(shape[1:]) if len(shape) > 1 else (shape[0] if shape else 1)


def _owner(model: nn.Module, name: str) -> tuple[str, str]:
    """(path of the innermost registered part holding `name`, the parameter's name local to it)."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        path = ".".join(parts[:cut])
        module = model.get_submodule(path)
        if path.split(".")[-1] in PART_KEYS or path == "final_norm" or contract.parameter_roles(module):
            return path, ".".join(parts[cut:])
    return "", name


def _key(path: str) -> str:
    last = [part for part in path.split(".") if part in PART_KEYS]
    if last:
        return PART_KEYS[last[0]]
    return "model.norm" if path.startswith("final_norm") else "model"
