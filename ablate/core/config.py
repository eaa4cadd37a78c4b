"""Typed sections of a resolved run config, and the small helpers that merge and check them."""

from __future__ import annotations

import copy
import dataclasses
import functools
import operator
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from jsonargparse.typing import (
    ClosedUnitInterval,
    NonNegativeFloat,
    NonNegativeInt,
    OpenUnitInterval,
    PositiveFloat,
    PositiveInt,
)

from ablate.core.errors import UserError, closest

COMPONENT_KEYS = ("attention", "norm", "ffn", "position")
# Keys whose value may be a bare name standing for {name: ...}: components and the like.
NAMED_SPEC_KEYS = (*COMPONENT_KEYS, "lambda_init", "tokenizer")


# Bounds on what a YAML text may expand to: a recipe is a few hundred values, so these refuse only hostile
# or mistaken files (an alias bomb: nine levels of nine aliases is 9^9 values from a 1 KB file; a file
# nested thousands deep). Both are checked on the composed node graph, before any Python object is built.
MAX_VALUES = 100_000  # mappings, sequences and scalars, with every alias expanded
MAX_DEPTH = 64  # nesting of mappings and sequences


class YamlTooLarge(ValueError):
    """A YAML text over `MAX_VALUES` or `MAX_DEPTH` (the message says which)."""


_BaseLoader = getattr(
    yaml, "CSafeLoader", yaml.SafeLoader
)  # libyaml's parser when PyYAML has it: ~10x faster


class _Loader(_BaseLoader):
    """Safe loading, with floats as YAML 1.2 and every researcher reads them: 1e-3 is 0.001, not a string;
    and with the size of the document bounded (aliases expanded) before it is constructed."""

    def construct_document(self, node: yaml.Node) -> Any:
        _check_bounds(node)
        return super().construct_document(node)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^[-+]?(?:\d[\d_]*)?(?:\.\d*)?[eE][-+]?\d+$|^[-+]?\d[\d_]*\.\d*$|^[-+]?\.\d+$"
        r"|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"
    ),
    list("-+0123456789."),
)


def _check_bounds(root: yaml.Node) -> None:
    """Count the values `root` expands to (an alias counts as a whole copy of what it names, counted once
    per node thanks to the memo, so an alias bomb costs microseconds) and its depth, iteratively."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    on_path: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        if key in size:
            continue
        children = _children(node)
        if not done:
            if key in on_path:  # a recursive alias (&a [*a]): infinite once expanded
                raise YamlTooLarge(
                    f"an alias refers to itself (more than {MAX_VALUES:,} values once expanded)"
                )
            on_path.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in size)
            continue
        on_path.discard(key)
        size[key] = 1 + sum(size[id(c)] for c in children)
        depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
        if size[key] > MAX_VALUES:
            raise YamlTooLarge(f"more than {MAX_VALUES:,} values once its aliases are expanded")
        if depth[key] > MAX_DEPTH:
            raise YamlTooLarge(f"nested more than {MAX_DEPTH} levels deep")


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def load_yaml(text: str) -> object:
    """`yaml.safe_load`, reading 1e-3 as a float. Never constructs arbitrary objects; a text over the
    bounds above raises `YamlTooLarge` before anything is built."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (_Loader is a SafeLoader)


MAX_FILE_BYTES = 1 << 18  # 256 KiB: retrieval.yaml, the largest recipe here, is 8 KB; parsed in ~0.1 s


def read_yaml_file(path: Path, key: str) -> object:
    """A recipe or search-spec file, loaded within bounds: over MAX_FILE_BYTES, not UTF-8 (a binary file
    named .yaml), invalid YAML, or expanding past MAX_VALUES / MAX_DEPTH is one `UserError` naming `key`
    and the file, raised before the text is parsed (size) or before any object is built (the rest)."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise UserError(
                f"{key}: {path} is {size:,} bytes; a recipe file is at most {MAX_FILE_BYTES:,} (is it the right file?)"
            )
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{key}: {path} is not UTF-8 text (byte {e.start}); is it the right file?") from None
    except OSError as e:
        raise UserError(f"{key}: cannot read {path}: {e}") from None
    try:
        return load_yaml(text)
    except YamlTooLarge as e:
        raise UserError(f"{key}: {path} is too large: {e}; a recipe is a few hundred values") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{key}: {path}{where}: invalid YAML: {getattr(e, 'problem', None) or e}") from None


def deep_merge(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """`overlay` on top of `base`, recursively. A component spec that names another component
    (different `name` or `class_path`) replaces the base spec instead of merging into it, so
    `attention: {name: diff}` never inherits softmax's options."""
    merged = copy.deepcopy(dict(base))
    for key, value in overlay.items():
        old = merged.get(key)
        if isinstance(old, str) and isinstance(value, Mapping) and not {"name", "class_path"} & set(value):
            old = {"name": old}  # `ffn: swiglu` in base + `ffn: {hidden_mult: 4}` in a variant: merge options
        if isinstance(old, Mapping) and isinstance(value, Mapping) and not _names_differ(old, value):
            merged[key] = deep_merge(old, value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _names_differ(old: Mapping, new: Mapping) -> bool:
    for tag in ("name", "class_path"):
        if tag in new and new[tag] != old.get(tag):
            return True
    return False


def set_dotted(tree: dict[str, Any], path: str, value: Any, *, key: str) -> None:
    """Set `a.b.c` inside nested dicts; the parent must exist (so typos fail instead of adding keys)."""
    parts = path.split(".")
    node: Any = tree
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part) if isinstance(node, dict) else None
        if (
            isinstance(child, str) and part in NAMED_SPEC_KEYS
        ):  # `attention: diff` -> `{name: diff}` to set an option
            child = node[part] = {"name": child}
        if not isinstance(child, dict):
            where = ".".join(parts[: depth + 1])
            known = sorted(node) if isinstance(node, dict) else []
            raise UserError(f"{key}: {where!r} is not a section of the recipe{closest(part, known)}")
        node = child
    node[parts[-1]] = value


# --- types jsonargparse validates -------------------------------------------------------------------
# Every recipe value is checked against the type hint of the dataclass field (or constructor parameter)
# it fills, by jsonargparse, the same validator LightningCLI and litgpt use for their command lines; this
# module only walks the mapping (so the error names the full dotted key) and words the one-line error.

PRECISIONS = (
    "auto",
    "bf16-mixed",
    "32-true",
    "16-mixed",
    "bf16-true",
    "64-true",
)  # auto: ablate.hardware.precision
Precision = Literal[PRECISIONS]  # the same values, as a type jsonargparse checks
_DESCRIBED = {
    PositiveInt: "a positive integer",
    NonNegativeInt: "a non-negative integer",
    PositiveFloat: "a positive number",
    NonNegativeFloat: "a non-negative number",
    ClosedUnitInterval: "a number in [0, 1]",
    OpenUnitInterval: "a number in (0, 1)",
}


@functools.cache  # stays: one parser per type hint (a fixed, small set); building one costs ~1 ms
def _validator(hint: Any) -> Any:
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--value", type=hint)
    return parser


def describe(hint: Any) -> str:
    """A type hint as the error and `--help` say it: int, a positive integer, one of a, b, list of str."""
    if hint in _DESCRIBED:
        return _DESCRIBED[hint]
    if _is_spec(hint):
        return "a name or a mapping"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list and args and _is_spec(args[0]):
        return "a list of names or mappings"
    if origin is Literal:
        return str(args[0]) if len(args) == 1 else "one of " + ", ".join(map(str, args))
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and _is_spec(
            functools.reduce(operator.or_, [a for a in args if a is not type(None)])
        ):
            return "a name, a mapping or null"
        return " or ".join("null" if a is type(None) else describe(a) for a in args)
    if origin in (list, tuple):
        inner = describe(args[0]) if args else "value"
        plural = (inner[2:] if inner.startswith("a ") else inner) + "s"
        return (
            f"a list of {len(args)} {plural}"
            if origin is tuple and ... not in args
            else f"a list of {plural}"
        )
    if origin is dict:
        return "a mapping"
    return getattr(hint, "__name__", str(hint))


def _strict(hint: Any, value: Any) -> bool:
    """What a YAML file says is taken as it is: 'no' is not a bool, 1 is not 1.0's bool, True is no int."""
    plain = (
        [a for a in typing.get_args(hint) if a is not type(None)]
        if typing.get_origin(hint) in (typing.Union, types.UnionType)
        else [hint]
    )
    literal = any(typing.get_origin(a) is Literal and value in typing.get_args(a) for a in plain)
    if bool in plain and isinstance(value, str) and not literal:  # `compile: auto` is a Literal's, not a bool
        return False
    if (
        isinstance(value, bool)
        and bool not in plain
        and any(a in (int, float) or a in _DESCRIBED for a in plain)
    ):
        return False
    return True


def check_value(key: str, hint: Any, value: Any) -> Any:
    """`value` validated (and normalised: 1 -> 1.0 for float, lists -> tuples) against `hint` by jsonargparse."""
    if hint is Any:
        return value
    return _check_value(key, hint, value)


def _check_value(key: str, hint: Any, value: Any) -> Any:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        if value is None:
            return None
        # X | None: null, or X checked as below
        hint = functools.reduce(operator.or_, [a for a in args if a is not type(None)])
    elif value is None and hint is not type(
        None
    ):  # jsonargparse lets null through where argparse defaults are
        raise UserError(f"{key}: expected {describe(hint)}, got null")
    if dataclasses.is_dataclass(hint):
        return load_section(hint, value, key)
    if typing.get_origin(hint) is dict and dataclasses.is_dataclass(typing.get_args(hint)[1]):
        return {
            name: load_section(typing.get_args(hint)[1], item, f"{key}.{name}")
            for name, item in _mapping(value, key).items()
        }
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is dict and args[1:] == (
        Any,
    ):  # free-form (component specs, overlays): checked where they land
        return _mapping(value, key)
    if origin is list and isinstance(value, list) and args and _is_spec(args[0]):
        return [_check_value(f"{key}[{i}]", args[0], item) for i, item in enumerate(value)]
    if _is_spec(hint):
        if isinstance(value, str):
            return value
        if isinstance(value, Mapping):  # its options are checked where it is built (ablate.core.registry)
            return _mapping(value, key)
        raise UserError(f"{key}: expected a name or a mapping, got {value!r} ({type(value).__name__})")
    if origin is list and args == (Any,) and isinstance(value, list):
        return list(value)
    if _strict(hint, value):
        try:
            # a copy: jsonargparse edits the mappings it is given in place (class_path bookkeeping)
            return _plain(_validator(hint).parse_object({"value": copy.deepcopy(value)}).value)
        except Exception:  # jsonargparse's ArgumentError (or a TypeError on values no YAML file holds)
            pass
    if typing.get_origin(hint) is Literal:
        raise UserError(f"{key}: {value!r} is not one of {', '.join(map(str, typing.get_args(hint)))}")
    raise UserError(f"{key}: expected {describe(hint)}, got {value!r} ({type(value).__name__})")


def _is_spec(hint: Any) -> bool:
    """A component's spec, `str | dict[str, Any]` (ablate.core.registry.Spec): a name or a mapping whose
    options are checked where the component is built."""
    return typing.get_origin(hint) is types.UnionType and typing.get_args(hint) == (str, dict[str, Any])


def _plain(value: Any) -> Any:
    """jsonargparse's result as the plain values a YAML file holds (its restricted ints are int subclasses)."""
    for plain in (bool, int, float, str):
        if isinstance(value, plain):
            return plain(value)
    if isinstance(value, tuple | list):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _mapping(value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise UserError(f"{key}: expected a mapping, got {type(value).__name__} {value!r}")
    for k in value:
        if not isinstance(k, str):
            raise UserError(f"{key}.{k!r}: keys must be text, got {type(k).__name__} {k!r}")
    return dict(value)


def load_section(cls: type, raw: Any, key: str, *, what: str = "key") -> Any:
    """Dataclass `cls` from a recipe mapping: unknown keys, missing keys and wrong types are `UserError`s
    naming `key.<field>` (`key` '' for the recipe's top level); a null section means every default."""
    raw = {} if raw is None else _mapping(raw, key or "recipe")
    dot = f"{key}." if key else ""
    hints = typing.get_type_hints(cls, include_extras=False)
    names = [f.name for f in dataclasses.fields(cls)]
    for name in raw:
        if name not in hints:
            raise UserError(f"{dot}{name}: unknown {what}{closest(name, names)}; keys: {', '.join(names)}")
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in raw and SIZE_LIMIT in f.metadata:
            values[f.name] = size_knob(f"{dot}{f.name}", raw[f.name], f.metadata[SIZE_LIMIT])
        elif f.name in raw:
            values[f.name] = check_value(f"{dot}{f.name}", hints[f.name], raw[f.name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise UserError(f"{dot}{f.name}: {f.metadata.get('missing', 'required, not set')}")
    return cls(**values)


# A size knob (a width, a depth, a length, a count) is a field `size(limit)`: an integer from 1 to its limit,
# checked before anything is built from it. The limits are far past any model trained today and short of
# what would take a machine down: a model's cost is computed per block (ablate.model.cost), but training
# builds every layer, and a float (1e9, 4.1e116) is no layer count.
SIZE_LIMIT = "size_limit"


def size(limit: int, **kwargs: Any) -> Any:
    """A dataclass field holding a size knob bounded by `limit` (kwargs: the field's default)."""
    return dataclasses.field(metadata={SIZE_LIMIT: limit}, **kwargs)


def size_knob(key: str, value: Any, limit: int) -> int:
    """`value` as a size knob: an integer (no float, no bool) from 1 to `limit`, or one `UserError` line."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise UserError(f"{key}: expected an integer from 1 to {limit:,}, got {_shown(value)}")
    return value


def check_sizes(section: Any, key: str) -> None:
    """Every size knob of dataclass instance `section` (recipe key `key`) within its limit."""
    for f in dataclasses.fields(section):
        if SIZE_LIMIT in f.metadata:
            size_knob(f"{key}.{f.name}", getattr(section, f.name), f.metadata[SIZE_LIMIT])


def _shown(value: Any) -> str:
    """A value for an error line: a huge integer by its size (its digits would be the line)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"an integer of about 10^{value.bit_length() * 30103 // 100000}"
    text = f"{value!r} ({type(value).__name__})"
    return text if len(text) <= 80 else text[:77] + "..."


def field_docs(cls: type) -> dict[str, str]:
    """{field: its one-line help} from the class docstring's `Attributes:` section (for `--help`)."""
    import docstring_parser

    doc = docstring_parser.parse(cls.__doc__ or "")
    return {p.arg_name: " ".join((p.description or "").split()) for p in doc.params}


# A recipe value that becomes a file or folder name (recipe name, scale, size and variant keys, search
# names): letters, digits, '_', '-', '.', starting with a letter or digit, no '..'. Nothing a recipe says
# can then point outside the workspace or the reports folder.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def safe_name(key: str, value: Any) -> str:
    if not isinstance(value, str) or not SAFE_NAME.match(value) or ".." in value:
        raise UserError(
            f"{key}: {value!r} becomes a file name; use letters, digits, '_', '-' and '.' "
            "(starting with a letter or digit, no '..', at most 64 characters)"
        )
    return value
