"""The component contract, written once: what the engine injects and what a component may tell it.

A component is a class registered under a kind (`ablate.core.registry.register`) or named by class path.
The engine (model, budget, check, train) reads components only through the functions of this module,
so every optional member below has one meaning and one default.

What the block injects (`INJECTED`): keyword arguments passed only if the constructor accepts them
(or takes `**kwargs`); the recipe supplies every other option.

    attention:   d_model, head_dim, layer_idx (0-based), n_layers, position (the recipe's
                 `model.position` spec: build it with `registry.build("position", position, head_dim=...)`),
                 backend (`model.attention_backend`), head_ratio (μP's head-width ratio, below)
    norm:        dim
    ffn:         d_model
    position:    head_dim (the width of the vectors it rotates)
    lambda_init: nothing (called with the layer index)

A component takes what its constructor accepts. One that does not take an injected recipe choice
(`COMPARED`) that the other rows' components take (for example an attention without `position` beside
RoPE rows) trains without it: `ablate check` names every such difference, one line each.

What a component may tell the engine (all optional; `Component` spells them out):

    flops(seq_len) -> int     forward FLOPs for one sequence (matrix products, 2 m n k each, attention
                              maps dense). Without it the engine counts the forward itself
                              (`counted_flops`: FlopCounterMode on fake tensors, batch 1, PyTorch's math
                              attention), and `ablate check` says which rows were counted which way.
    residual_out              names of parameters that start at zero (residual output projections)
                              when the model's `zero_init_residual` is on (the default).
    init_std                  {parameter name: std}: drawn Normal(0, std) instead of the model's rule.
    describe() -> dict        the columns `ablate check` and the reports show (`Description`): for
                              attention `heads`, `width`, `per_head_norm`, `lambda` (its λ rule, in its
                              own words). Without it the columns read "?".
    lambda_value() -> Tensor  a 0-dim λ, logged per layer during training (`lambda/layer_XX`).
    attend_with_maps(...)     for attention: its maps and pre-softmax logits (below).
    parameter_roles           {parameter name: role}: what each of its parameters is to the maximal update
                              parametrization (`model.parametrization: mup`), one of `ROLES`:
                              "input"  maps a fixed size to the width (an embedding);
                              "hidden" maps the width to the width (q/k/v/out projections, FFN matrices);
                              "output" maps the width to a fixed size (a readout, e.g. one gate per head);
                              "vector" has at most one width dimension and no fan-in that grows with it
                                       (norm gains, λ vectors, biases, scalars).
                              Under `standard` it is never read. Under `mup` every parameter must have one
                              (the engine refuses a component that leaves one out, in one line); the rules
                              each role gets are written in `ablate.model.parametrization`.

Width-dependent scales an attention applies itself. Under `mup` the block injects `head_ratio` (the
component's head width over the base model's: `model.head_dim / base_head_dim`; 1.0 under `standard`).
An attention that takes it multiplies its queries by head_ratio ** -0.5, so its logits are Q K^T / d
times sqrt(d_base) (μP's 1/d rule, equal to 1/sqrt(d) at the base width), and multiplies any inner
product of two learned width-d vectors (diff's λ re-parametrisation) by 1 / head_ratio. With head_ratio
1.0 it must compute exactly what it computes without it. An attention that does not take `head_ratio` is
refused under `mup` when the ratio is not 1.

Attention analysis. An attention component that can be analysed implements

    def attend_with_maps(self, x, *, logit_transform=None) -> tuple[Tensor, AttentionMaps]

It returns exactly what `forward(x)` returns (computed by its reference/math path, so the maps exist)
together with its maps. `logit_transform`, when given, is applied to every pre-softmax logit tensor
(Q K^T / sqrt(d), before the causal mask) and the output is computed from the transformed logits: this
is how the low-bit-logit probe quantizes attention without knowing the component.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict, runtime_checkable

import torch
from torch import nn

LogitTransform = Callable[[torch.Tensor], torch.Tensor]

INJECTED: dict[str, tuple[str, ...]] = {
    "attention": ("d_model", "head_dim", "layer_idx", "n_layers", "position", "backend", "head_ratio"),
    "norm": ("dim",),
    "ffn": ("d_model",),
    "position": ("head_dim",),
    "lambda_init": (),
}

# The injected structure that is a choice of the recipe for every row and changes what a row computes when a
# component leaves it out (an attention without `position` trains without the recipe's RoPE; one without
# `head_dim` picks its own head width). `layer_idx`, `n_layers` and `backend` are each component's own
# business (depth-dependent rules, kernels), and `d_model` / `dim` every component needs to fit the model.
COMPARED = ("position", "head_dim")

# What each injected name is, in the recipe's words (for the lines `ablate check` prints).
SOURCE = {
    "d_model": "model.d_model",
    "dim": "model.d_model",
    "head_dim": "model.head_dim",
    "layer_idx": "the layer index",
    "n_layers": "model.n_layers",
    "position": "model.position",
    "backend": "model.attention_backend",
    "head_ratio": "model.parametrization",
}
CONSEQUENCE = {
    "position": "it trains without positional encoding",
    "layer_idx": "every layer is built the same",
    "backend": "it ignores the attention backend",
    "head_ratio": "its logits keep 1/sqrt(d) under μP",
}

# The roles a parameter may have under the maximal update parametrization (module docstring).
INPUT, HIDDEN, OUTPUT, VECTOR = "input", "hidden", "output", "vector"
ROLES = (INPUT, HIDDEN, OUTPUT, VECTOR)


# What `describe()` returns; every key optional. Attention: heads, width (the head width d of the Table 6
# column), per_head_norm (the GN column), lambda (the λ rule in the component's words, e.g. "exp_depth",
# "constant 0.8"). (Functional form: `lambda` is a Python keyword.)
Description = TypedDict(
    "Description",
    {"heads": "int | str", "width": "int | str", "per_head_norm": bool, "lambda": str},
    total=False,
)


class Component(Protocol):
    """The optional members a component may define (see the module docstring). Nothing here is required:
    a plain `nn.Module` with a forward is a component."""

    residual_out: tuple[str, ...]
    init_std: Mapping[str, float]
    parameter_roles: Mapping[str, str]

    def flops(self, seq_len: int) -> int: ...

    def describe(self) -> Description: ...


# --- what the engine reads ---------------------------------------------------------------------------


def residual_out(module: nn.Module) -> tuple[str, ...]:
    """Local names of the parameters that start at zero (under `zero_init_residual`)."""
    return tuple(getattr(module, "residual_out", ()))


def init_std(module: nn.Module) -> dict[str, float]:
    """Local parameter name -> std of its zero-mean normal initialisation, overriding the model's rule."""
    return dict(getattr(module, "init_std", None) or {})


def parameter_roles(module: nn.Module) -> dict[str, str]:
    """Local parameter name -> its μP role (`ROLES`), as the component declares it; `{}` if it declares none."""
    return dict(getattr(module, "parameter_roles", None) or {})


def describe(module: object) -> dict[str, Any]:
    """The component's own columns; `{}` if it describes nothing."""
    method = getattr(module, "describe", None)
    return dict(method()) if callable(method) else {}


def lambda_value(module: object) -> float | None:
    """The component's λ (`lambda_value()`, a 0-dim tensor), logged per layer in training; None without one."""
    method = getattr(module, "lambda_value", None)
    return float(method().detach()) if callable(method) else None


def attention_columns(module: object) -> dict[str, str]:
    """#heads, d, GN, λ_init cells of `ablate check` and the run tags, in the component's words."""
    info = describe(module)
    norm = info.get("per_head_norm")
    return {
        "heads": str(info.get("heads", "?")),
        "d": str(info.get("width", "?")),
        "gn": "?" if norm is None else ("yes" if norm else "no"),
        "lambda_init": str(info.get("lambda", "-")),
    }


def takes(cls: type) -> set[str] | None:
    """The names a constructor accepts; None if it takes `**kwargs` (then it is given everything)."""
    params = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return {n for n, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def consumed(cls: type, kind: str) -> set[str]:
    """The injected structure of `kind` that `cls` accepts."""
    accepted = takes(cls)
    return set(INJECTED.get(kind, ())) if accepted is None else set(INJECTED.get(kind, ())) & accepted


# --- FLOPs -------------------------------------------------------------------------------------------


def component_flops(module: nn.Module, seq_len: int, width: int) -> tuple[int, str]:
    """(forward FLOPs for one sequence, "hand" | "counted"): the component's `flops()` if it has one,
    else `counted_flops` on an input (1, seq_len, width)."""
    method = getattr(module, "flops", None)
    if callable(method):
        return int(method(seq_len)), "hand"
    return counted_flops(module, seq_len, width), "counted"


def counted_flops(module: nn.Module, seq_len: int, width: int) -> int:
    """Forward FLOPs of `module` on an input (1, seq_len, width), counted by FlopCounterMode.

    Nothing is computed or allocated: a copy of the module runs on fake CPU tensors (the module itself
    may live on `meta`; the copy keeps caches it fills away from the original). Scaled-dot-product
    attention is forced to PyTorch's math form, so maps count dense (N x N), as the hand formulas do.
    """
    key = _fingerprint(module, seq_len, width)
    if key not in _COUNTED:
        _COUNTED[key] = _count(module, seq_len, width)
    return _COUNTED[key]


_COUNTED: dict[tuple, int] = {}


def _fingerprint(module: nn.Module, seq_len: int, width: int) -> tuple:
    """Everything a forward's FLOPs can depend on: class, tensor shapes, simple attributes (so the 24
    identical layers of a budget are counted once, and a solver's repeated budgets cost nothing)."""
    parts = []
    for path, sub in module.named_modules():
        simple = sorted(
            (k, repr(v))
            for k, v in vars(sub).items()
            if not k.startswith("_") and isinstance(v, int | float | str | bool | None | tuple | list | dict)
        )
        tensors = [
            (n, tuple(t.shape), t.dtype)
            for n, t in (*sub.named_parameters(recurse=False), *sub.named_buffers(recurse=False))
        ]
        parts.append((path, type(sub).__module__, type(sub).__qualname__, tuple(simple), tuple(tensors)))
    return (seq_len, width, tuple(parts))


def _count(module: nn.Module, seq_len: int, width: int) -> int:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.func import functional_call
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    # The copy's parameters and buffers are meta tensors (functional_call swaps in fakes anyway), so a
    # real model's weights are never duplicated.
    memo = {
        id(p): nn.Parameter(p.detach().to("meta"), requires_grad=p.requires_grad) for p in module.parameters()
    }
    memo.update({id(b): b.detach().to("meta") for b in module.buffers()})
    module = copy.deepcopy(module, memo)
    tensors = [
        *module.named_parameters(remove_duplicate=False),
        *module.named_buffers(remove_duplicate=False),
    ]
    # allow_non_fake_inputs: tensors a module keeps outside its state (caches) take part as fakes.
    with torch.device("cpu"), FakeTensorMode(allow_non_fake_inputs=True):
        state = {name: torch.empty(t.shape, dtype=t.dtype) for name, t in tensors}
        x = torch.empty(1, seq_len, width, dtype=_dtype(tensors))
        with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            functional_call(module, state, (x,))
    return int(counter.get_total_flops())


def _dtype(tensors: list[tuple[str, torch.Tensor]]) -> torch.dtype:
    floats = [t.dtype for _, t in tensors if t.is_floating_point()]
    return floats[0] if floats else torch.get_default_dtype()


# --- attention analysis ------------------------------------------------------------------------------


@dataclass
class AttentionMaps:
    """What one attention layer computed for one input, for analysis.

    logits:    pre-softmax logits Q K^T / sqrt(d) of every softmax map, each (batch, heads, seq, seq),
               after `logit_transform` if one was given; entries above the diagonal (masked by the causal
               mask) are whatever the product gave: readers mask them themselves with `causal_mask`.
               Softmax attention: one tensor; Diff (V1): two (the Q1K1 and Q2K2 maps); Diff V2: one over
               its 2h query heads.
    effective: (batch, out_heads, seq, seq): the weights each output head applies to its values, so the
               head's (pre-norm) output is `effective @ V`. Softmax: A. Diff: A1 - λ A2 (entries may be
               negative). Diff V2: A_2i - σ_i A_2i+1 with σ per query row. Causal entries are zero.
    """

    logits: tuple[torch.Tensor, ...]
    effective: torch.Tensor


@runtime_checkable
class AnalysableAttention(Protocol):
    def attend_with_maps(
        self, x: torch.Tensor, *, logit_transform: LogitTransform | None = None
    ) -> tuple[torch.Tensor, AttentionMaps]: ...


def causal_mask(n: int, device: torch.device | None = None) -> torch.Tensor:
    """(n, n) bool, True where query i may attend to key j (j <= i)."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()
