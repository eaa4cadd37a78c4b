"""Kinds -> names -> component classes.

A component is a class (usually a `torch.nn.Module`) registered under a kind with `@register`:

    @register("attention", "my_attn")
    class MyAttention(nn.Module):
        '''One line that `ablate components` prints.'''
        def __init__(self, *, d_model: int, head_dim: int, my_option: float = 0.5): ...

A recipe names it as `attention: my_attn` or `attention: {name: my_attn, my_option: 0.7}`, or, for a class
that is not registered, jsonargparse-style `{class_path: pkg.mod.Class, init_args: {...}}`.
`build` injects the structure the caller knows (`d_model`, `layer_idx`, ...) into the keyword arguments
the constructor accepts; the recipe supplies the rest. Unknown names and options are `UserError`s that
list what is allowed and the closest match.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import importlib
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from ablate.core.errors import UserError, closest  # noqa: F401 (closest: also imported from here by components)

KINDS = ("attention", "norm", "lambda_init", "ffn", "position", "task", "probe")
ENTRY_POINT_GROUP = "ablate.components"

_REGISTRY: dict[str, dict[str, type]] = {kind: {} for kind in KINDS}

# How a recipe names a component (module docstring): its registered name, or a mapping with `name` and its
# options, or jsonargparse's `class_path` and `init_args`. The type of every config field that holds one.
Spec = str | dict[str, Any]


@dataclass(frozen=True)
class Entry:
    kind: str
    name: str
    cls: type

    @property
    def description(self) -> str:
        doc = inspect.cleandoc(self.cls.__dict__.get("__doc__") or "")  # its own, not nn.Module's
        return doc.splitlines()[0] if doc else ""

    @property
    def class_path(self) -> str:
        return f"{self.cls.__module__}.{self.cls.__qualname__}"


def register(kind: str, name: str) -> Callable[[type], type]:
    """Class decorator: make `cls` buildable by `name` under `kind`."""
    if kind not in _REGISTRY:
        raise ValueError(f"unknown component kind {kind!r}; kinds are {', '.join(KINDS)}")

    def decorate(cls: type) -> type:
        existing = _REGISTRY[kind].get(name)
        if existing is not None and existing is not cls and _path(existing) != _path(cls):
            raise ValueError(f"{kind} {name!r} is already registered by {_path(existing)}")
        _REGISTRY[kind][name] = cls
        cls.registry_kind, cls.registry_name = kind, name
        return cls

    return decorate


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def get(kind: str, name: str, *, key: str | None = None) -> type:
    """The class registered as `name` under `kind`; `key` names the recipe key in the error."""
    load_plugins()
    if kind not in _REGISTRY:
        raise UserError(f"{key or 'kind'}: unknown component kind {kind!r}; kinds are {', '.join(KINDS)}")
    try:
        return _REGISTRY[kind][name]
    except (KeyError, TypeError):
        known = sorted(_REGISTRY[kind])
        raise UserError(
            f"{key or kind}: unknown {kind} {name!r}{closest(name, known)}; known: {', '.join(known)}"
        ) from None


def entries(kind: str | None = None) -> list[Entry]:
    """Every registered component (of one kind), sorted by kind then name."""
    load_plugins()
    kinds = KINDS if kind is None else (kind,)
    if kind is not None and kind not in _REGISTRY:
        raise UserError(f"--kind: unknown kind {kind!r}{closest(kind, KINDS)}; kinds are {', '.join(KINDS)}")
    return [Entry(k, n, c) for k in kinds for n, c in sorted(_REGISTRY[k].items())]


def split_spec(spec: Any, *, kind: str, key: str) -> tuple[type, dict[str, Any]]:
    """A recipe's component spec -> (class, recipe keyword arguments)."""
    if isinstance(spec, str):
        return get(kind, spec, key=key), {}
    if isinstance(spec, Mapping):
        spec = dict(spec)
        if "class_path" in spec:
            extra = set(spec) - {"class_path", "init_args"}
            if extra:
                raise UserError(f"{key}: with class_path only init_args may be given, not {sorted(extra)}")
            return _import_class(spec["class_path"], key=key), dict(spec.get("init_args") or {})
        if "name" in spec:
            name = spec.pop("name")
            return get(kind, name, key=f"{key}.name"), spec
    raise UserError(
        f"{key}: expected a {kind} name, {{name: ..., <options>}} or {{class_path: ..., init_args: ...}}, "
        f"got {spec!r}"
    )


def spec_name(spec: Any) -> str:
    """The registry name (or class path) a spec refers to, for tables and run names."""
    if isinstance(spec, str):
        return spec
    if isinstance(spec, Mapping):
        return str(spec.get("name") or spec.get("class_path"))
    return repr(spec)


# What the engine injects into a component's constructor (each only if the constructor takes it):
# the model's structure, never a recipe option.
STRUCTURE = ("d_model", "head_dim", "layer_idx", "n_layers", "position", "backend", "head_ratio", "dim")


@dataclass(frozen=True)
class Option:
    """One recipe option of a component: its constructor parameter, typed and documented."""

    name: str
    hint: Any
    default: Any  # inspect.Parameter.empty when required
    help: str

    @property
    def required(self) -> bool:
        return self.default is inspect.Parameter.empty


def options_of(cls: type, *, structure: Iterable[str] = STRUCTURE) -> list[Option]:
    """The recipe options `cls` accepts (see `_options_of`)."""
    return _options_of(cls, frozenset(structure))


@functools.cache  # stays: a class's signature and docstring never change; `ablate components` lists many
def _options_of(cls: type, structure: frozenset[str]) -> list[Option]:
    """The recipe options `cls` accepts: its keyword parameters minus the injected structure, with their
    type hints and the one-line help of its docstring (`Args:`) where it has one."""
    import typing

    import docstring_parser

    params = inspect.signature(cls).parameters
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # a hint that does not resolve: validate that option as Any
        hints = {}
    # `Args:` in the class docstring or in `__init__`'s own (a function's __doc__ is not inherited, where
    # inspect.getdoc would hand down nn.Module.__init__'s); __init__'s wins where both name an option.
    docs = {
        p.arg_name: " ".join((p.description or "").split())
        for text in (cls.__doc__, cls.__init__.__doc__)
        for p in docstring_parser.parse(inspect.cleandoc(text or "")).params
    }
    return [
        Option(n, hints.get(n, Any), p.default, docs.get(n, ""))
        for n, p in params.items()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and n not in structure
    ]


def check_spec(
    kind: str, spec: Any, *, key: str | None = None, structure: Iterable[str] = STRUCTURE
) -> tuple[type, dict[str, Any]]:
    """A component spec checked against its constructor's signature and type hints, before anything is
    built: the class, and the recipe options with their values as jsonargparse normalised them. An
    option named after a component kind (diff's `lambda_init`) is checked as a spec of that kind."""
    from ablate.core.config import check_value

    key = key or kind
    cls, options = split_spec(spec, kind=kind, key=key)
    params = inspect.signature(cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    known = {o.name: o for o in options_of(cls, structure=structure)}
    checked = {}
    for option, value in options.items():
        if option in params and option in structure:
            raise UserError(
                f"{key}.{option}: set by the model ({', '.join(STRUCTURE)} are injected), not the recipe"
            )
        if option not in known:
            if takes_any:
                checked[option] = value
                continue
            raise UserError(
                f"{key}.{option}: {_path(cls)} has no option {option!r}{closest(option, known)}; "
                f"options: {', '.join(known) or '(none)'}"
            )
        if option in _REGISTRY and value is not None:  # a nested component (diff's lambda_init)
            check_spec(option, value, key=f"{key}.{option}")
            checked[option] = value
        else:
            checked[option] = check_value(f"{key}.{option}", known[option].hint, value)
    missing = [o.name for o in known.values() if o.required and o.name not in options]
    if missing:
        raise UserError(f"{key}.{missing[0]}: required option of {_path(cls)}, not set")
    return cls, checked


def build(kind: str, spec: Any, *, key: str | None = None, **structure: Any) -> Any:
    """Instantiate a component from its recipe spec (checked by `check_spec`).

    `structure` holds what the caller injects (d_model, layer_idx, ...); each is passed only if the
    constructor accepts it, so a component takes just what it needs.
    """
    return builder(kind, spec, key=key, structure=structure)(**structure)


def builder(
    kind: str, spec: Any, *, key: str | None = None, structure: Iterable[str] = ()
) -> Callable[..., Any]:
    """Check `spec` once (`check_spec`) and return a function that builds it from the structure the
    caller injects: a model checks each component once, then builds it for every layer."""
    key = key or kind
    cls, options = check_spec(kind, spec, key=key, structure={*STRUCTURE, *structure})
    params = inspect.signature(cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

    def make(**structure: Any) -> Any:
        injected = {n: v for n, v in structure.items() if n in params or takes_any}
        try:
            return cls(**injected, **copy.deepcopy(options))
        except TypeError as e:  # a required structure argument the caller does not inject
            raise UserError(f"{key}: cannot build {_path(cls)}: {e}") from None

    return make


# Why no module path is resolved now (`importing_nothing`), or None: a spec's `class_path` and a recipe's
# `imports:` are the two ways a recipe names code, and both are resolved here, in `_import_class` and
# `load_plugins`.
_REFUSING: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "ablate_importing_nothing", default=None
)


@contextlib.contextmanager
def importing_nothing(why: str) -> Iterator[None]:
    """While held, a `class_path` or an `imports:` module is one line ending in `why` instead of an import
    (what `--from` reads from an export is data: ablate.store.export); registered components, installed
    code found through the entry points, still build."""
    token = _REFUSING.set(why)
    try:
        yield
    finally:
        _REFUSING.reset(token)


def _import_class(path: str, *, key: str) -> type:
    if (why := _REFUSING.get()) is not None:
        raise UserError(f"{key}.class_path: {str(path)!r} is not imported: {why}")
    module_name, _, attr = str(path).rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise UserError(f"{key}.class_path: cannot import {path!r}: {e}") from None


_loaded_entry_points = False


def load_plugins(imports: Iterable[str] = ()) -> None:
    """Import every module of the `ablate.components` entry-point group, then `imports`.

    The built-ins are found the way a third-party package's components are: this distribution's own
    pyproject lists `components` (the zoo), `ablate.probes` (kind `probe`) and `ablate.data.tasks` (kind
    `task`) in the group, so the registry names nothing above it. The group is read once; `imports` (a
    recipe's `imports:` list) are imported every call, which Python makes cheap after the first time.
    """
    global _loaded_entry_points
    if not _loaded_entry_points:
        _loaded_entry_points = True
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            importlib.import_module(ep.value)
    for module in imports:
        if (why := _REFUSING.get()) is not None:
            raise UserError(f"imports: {module!r} is not imported: {why}")
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise UserError(f"imports: cannot import {module!r}: {e}") from None
