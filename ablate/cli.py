"""The command line: argv -> one verb of `ablate.verbs`, parsed by jsonargparse from the verb's typed function.

Each verb is a function (one module each in `ablate.verbs`) whose signature and docstring are its options
(type, default, one-line help in `ablate <verb> --help`), kept in `VERBS` (litgpt's dict of verbs). This
module holds argv only: splitting, help, parsing and `main`; no verb's body. Heavy imports happen inside
the verbs, so `ablate --help` is instant. What the verb's signature does not name is a dotted recipe override
(`--base.train.lr 3e-4`, `--variants.diff.model.attention.per_head_norm false`, `base.train.steps=7`),
checked against the recipe's types when the recipe is loaded; `ablate <verb> --help` lists the recipe's
`base.*` options with their types too. `--print_config` (or `--print-config`) prints the resolved recipe,
a file `ablate check` accepts as it is. A `UserError` anywhere becomes one line on stderr and exit code 2.

Flags are spelled with dashes as the README writes them (`--allow-unmatched`) or with underscores as
jsonargparse and LightningCLI users type them (`--allow_unmatched`); a bare boolean flag means true; a
list takes the values after it (`--seeds 0 1 2`). Flags are never abbreviated: a prefix such as `--h` or
`--scal` is read as a recipe override and refused by the recipe's keys.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

from ablate.core.errors import UserError
from ablate.verbs.bench import bench
from ablate.verbs.check import check
from ablate.verbs.components import components
from ablate.verbs.eval import evaluate
from ablate.verbs.fit import fit
from ablate.verbs.options import DEFAULT_WORKSPACE, Shared, load
from ablate.verbs.prepare import prepare
from ablate.verbs.report import report
from ablate.verbs.server import server
from ablate.verbs.status import status
from ablate.verbs.sweep import sweep
from ablate.verbs.train import train
from ablate.verbs.ui import ui
from ablate.verbs.worker import worker

__all__ = ["DEFAULT_WORKSPACE", "VERBS", "main", "parse_args"]

VERBS: dict[str, Callable[..., int]] = {
    "components": components,
    "check": check,
    "train": train,
    "sweep": sweep,
    "worker": worker,
    "status": status,
    "report": report,
    "fit": fit,
    "bench": bench,
    "prepare": prepare,
    "eval": evaluate,
    "ui": ui,
    "server": server,
}
POSITIONAL = {"recipe"}  # every other parameter is a flag
PRINT_CONFIG = ("--print_config", "--print-config")


# --- the parser -------------------------------------------------------------------------------------------
# jsonargparse builds each verb's parser from its signature and docstring, validates the types, prints the
# help and the subcommands. What is written by hand below, and why jsonargparse cannot do it:
# - split_argv: a verb's unknown arguments are recipe overrides (`--base.train.lr 3e-4`, `--scal` refused as
#   a recipe key): jsonargparse has no parse_known_args, so the argv is split before it parses. The same
#   pass lets a boolean flag stand bare (`--yes`; jsonargparse wants `--yes true`) and a list take the
#   values after it (`--seeds 0 1 2`; jsonargparse wants `--seeds [0,1,2]` or `--seeds+` per value).
# - _one_line: jsonargparse's errors run over several lines of detail; a user error here is one line.
# - Flag and verb_flags: the flags of a verb are its signature, its `Shared` options and, where the verb
#   names a library function as `flags_from` (bench: run_bench), that function's keyword-only arguments
#   with defaults, less the verb's `internal` ones (the library's, not the command line's).
@dataclasses.dataclass(frozen=True)
class Flag:
    name: str  # the parameter
    hint: Any
    default: Any

    @property
    def is_bool(self) -> bool:
        return _strip_none(self.hint) is bool

    @property
    def is_list(self) -> bool:
        return typing.get_origin(_strip_none(self.hint)) is list


def _strip_none(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1 else hint


def verb_flags(verb: str) -> dict[str, Flag]:
    """The verb's parameters (flags and positionals) with their type hints, and those of its `flags_from`."""
    fn = VERBS[verb]
    hints = typing.get_type_hints(fn)
    flags = {
        n: Flag(n, hints[n], p.default)
        for n, p in inspect.signature(fn).parameters.items()
        if p.kind is p.POSITIONAL_OR_KEYWORD
    }
    shared_hints = typing.get_type_hints(Shared)
    for f in dataclasses.fields(Shared):
        if f.name in getattr(fn, "shared", ()):
            flags[f.name] = Flag(f.name, shared_hints[f.name], f.default)
    flags.update(_flags_from(fn))
    return flags


def _flags_from(fn: Callable) -> dict[str, Flag]:
    """The keyword-only arguments with defaults of the library function a verb names as `flags_from`
    ((module, name): read when asked, so the function there now is the one described), less those the
    verb's signature already has and its `internal` ones."""
    if not hasattr(fn, "flags_from"):
        return {}
    module, name = fn.flags_from
    target = getattr(importlib.import_module(module), name)
    hints = typing.get_type_hints(target)
    covered = set(inspect.signature(fn).parameters) | set(getattr(fn, "internal", ()))
    return {
        n: Flag(n, hints.get(n, str), p.default)
        for n, p in inspect.signature(target).parameters.items()
        if p.kind is p.KEYWORD_ONLY and n not in covered and p.default is not p.empty
    }


def _takes_overrides(verb: str) -> bool:
    return "overrides" in inspect.signature(VERBS[verb]).parameters


def build_parser(verb: str | None = None):
    """The jsonargparse parser: one subcommand per verb from its function (`verb` given: that verb's
    parser with everything, including run_bench's extra options and the recipe's base.* options in --help)."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(
        prog="ablate",
        description="Declarative architecture ablations of decoder language "
        "models: ablate <verb> --help for each verb's options. There is no --config FILE: the recipe "
        "(the first argument of every verb that trains) is the config file, and --print_config writes "
        "one resolved, with the overrides applied.",
        exit_on_error=False,
    )
    from ablate import __version__

    parser.add_argument("--version", action="version", version=f"ablate {__version__}")
    subcommands = parser.add_subcommands(dest="verb", required=True)
    for name, fn in VERBS.items():
        usage = None
        if name == verb and _takes_overrides(name):  # the recipe options are many: --help lists them below
            usage = f"ablate {name} [options] [--base.SECTION.KEY VALUE ...] [--variants.VARIANT.SECTION.KEY VALUE ...]"
        sub = ArgumentParser(
            prog=f"ablate {name}", description=_first_line(fn), usage=usage, exit_on_error=False
        )
        if name == verb:
            _add_verb_arguments(sub, name)
            if _takes_overrides(name) and not hasattr(
                fn, "flags_from"
            ):  # bench: the recipe is a model's source
                _add_recipe_help(sub)
        subcommands.add_subcommand(name, sub, help=_first_line(fn))
    return parser


def _add_verb_arguments(sub, verb: str) -> None:
    fn = VERBS[verb]
    docs = _param_docs(fn)
    group = sub.add_argument_group("options shared with other verbs (ablate.verbs.options.Shared)")
    for flag in verb_flags(verb).values():
        help_text = docs.get(flag.name, "")
        where = group if flag.name in getattr(fn, "shared", ()) else sub
        if flag.name in POSITIONAL:
            kwargs: dict[str, Any] = (
                {"nargs": "?", "default": flag.default} if flag.default is not inspect._empty else {}
            )
            where.add_argument(flag.name, type=flag.hint, help=help_text, **kwargs)
            continue
        dashed, under = "--" + _spelled(flag.name).replace("_", "-"), "--" + _spelled(flag.name)
        names = [dashed] if dashed == under else [dashed, under]
        required = flag.default is inspect._empty
        where.add_argument(
            *names,
            dest=flag.name,
            type=flag.hint,
            help=help_text,
            required=required,
            **({} if required else {"default": flag.default}),
        )
    if _takes_overrides(verb):
        sub.add_argument(
            *PRINT_CONFIG,
            dest="print_config",
            type=bool,
            default=False,
            help="print the resolved recipe (a file `ablate check` accepts as it is) and exit",
        )


def _add_recipe_help(sub) -> None:
    """The recipe's base.* options, in --help only (their values go through the recipe, as overrides)."""
    from ablate.core.config import TrainConfig, field_docs
    from ablate.data.config import DataConfig
    from ablate.model.decoder import ModelConfig

    for section, cls in (("model", ModelConfig), ("train", TrainConfig), ("data", DataConfig)):
        group = sub.add_argument_group(
            f"recipe options: base.{section} (dotted overrides, applied to every run; "
            f"also --variants.KEY.{section}.OPTION)"
        )
        docs, hints = field_docs(cls), typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            default = (
                None
                if required
                else f.default
                if f.default is not dataclasses.MISSING
                else f.default_factory()
            )
            note = " (required in the recipe)" if required else ""
            note += (
                " (a component spec: name, {name: ..., <options>} or class_path/init_args)"
                if hints[f.name] is Any
                else ""
            )
            group.add_argument(
                f"--base.{section}.{f.name}",
                dest=f"recipe_help.{section}.{f.name}",
                type=hints[f.name],
                default=default,
                metavar="VALUE",
                help=docs.get(f.name, "") + note,
            )


def _spelled(name: str) -> str:
    """A parameter's flag: `from_` (a Python keyword with an underscore) is spelled `--from`."""
    return name[:-1] if name.endswith("_") else name


def _first_line(fn: Callable) -> str:
    """The docstring's first paragraph, as one line (a summary may wrap over several)."""
    return " ".join((inspect.getdoc(fn) or "").split("\n\n")[0].split())


def _param_docs(fn: Callable) -> dict[str, str]:
    """The verb's `Args:` helps, and those of the `Shared` options it takes."""
    import docstring_parser

    from ablate.core.config import field_docs

    own = {
        p.arg_name: " ".join((p.description or "").split())
        for p in docstring_parser.parse(inspect.getdoc(fn) or "").params
    }
    return {**{k: v for k, v in field_docs(Shared).items() if k in getattr(fn, "shared", ())}, **own}


DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")


def split_argv(verb: str, argv: list[str]) -> tuple[list[str], list[str], bool]:
    """The verb's arguments -> (arguments for jsonargparse, recipe override tokens, print_config).

    Flags the verb's signature names are the verb's (bare booleans become `true`, a list takes the values
    after it); `--print_config`/`--print-config` is ours; everything else that looks like a flag or a
    `key=value` is a recipe override, whole: `--h` is never `--help`, `--scal` never `--scale`."""
    flags = verb_flags(verb)
    by_spelling = {}
    for flag in flags.values():
        if flag.name not in POSITIONAL:
            spelled = _spelled(flag.name)
            by_spelling["--" + spelled] = by_spelling["--" + spelled.replace("_", "-")] = flag
    known: list[str] = []
    overrides: list[str] = []
    print_config = False
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, value = token.partition("=")
        if token in ("-h", "--help"):
            named = getattr(
                VERBS[verb], "help_option", None
            )  # `ablate components --help diff`: --options diff
            if named and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                known += [f"--{named}", argv[i + 1]]
                i += 2
                continue
            known.append(token)
        elif name in PRINT_CONFIG:
            print_config = True
        elif name in by_spelling:
            flag = by_spelling[name]
            if eq:
                known += [name, value]
            elif flag.is_bool:
                follows = i + 1 < len(argv) and argv[i + 1].lower() in ("true", "false")
                known += [name, argv[i + 1] if follows else "true"]
                i += follows
            elif flag.is_list:
                j = i + 1
                while j < len(argv) and not argv[j].startswith("--"):
                    j += 1
                if j == i + 1:
                    raise UserError(f"{name}: needs at least one value")
                known += [name, json.dumps([_scalar(v) for v in argv[i + 1 : j]])]
                i = j - 1
            else:
                if i + 1 >= len(argv):
                    raise UserError(f"{name}: needs a value (see ablate {verb} --help)")
                known += [name, argv[i + 1]]
                i += 1
        elif token.startswith("--"):
            overrides.append(token)
            if not eq and i + 1 < len(argv):
                overrides.append(argv[i + 1])
                i += 1
        elif eq and DOTTED.match(name) and "." in name:
            overrides.append(token)
        else:
            known.append(token)
        i += 1
    return known, overrides, print_config


def _scalar(text: str) -> Any:
    from ablate.core.config import load_yaml

    try:
        value = load_yaml(text)
    except Exception:
        return text
    return value if isinstance(value, int | float | str) and not isinstance(value, bool) else text


def parse_args(argv: Sequence[str]) -> tuple[str, dict[str, Any], list, bool]:
    """argv -> (verb, its keyword arguments, recipe overrides as (dotted key, value), print_config)."""
    from jsonargparse import ArgumentParser  # noqa: F401 (the parser's errors are jsonargparse's)

    argv = list(argv)
    verb = next((a for a in argv if not a.startswith("-")), None)
    if verb is None or verb not in VERBS:
        if verb is not None:
            from ablate.core.errors import closest

            raise UserError(f"ablate: unknown verb {verb!r}{closest(verb, VERBS)}; verbs: {', '.join(VERBS)}")
        build_parser().parse_args(argv or ["--help"])  # `ablate`, `ablate --help`: the verbs
        raise UserError("ablate: give a verb (see ablate --help)")
    at = argv.index(verb)
    known, override_tokens, print_config = split_argv(verb, argv[at + 1 :])
    if override_tokens and not _takes_overrides(verb):
        raise UserError(
            f"ablate {verb}: unexpected arguments {' '.join(override_tokens)} (see ablate {verb} --help)"
        )
    try:
        namespace = build_parser(verb).parse_args([*argv[:at], verb, *known])
    except Exception as e:  # jsonargparse's ArgumentError: several lines of detail -> one
        if type(e).__name__ not in ("ArgumentError", "NSKeyError", "ValueError", "TypeError"):
            raise
        raise UserError(_one_line(verb, str(e), known)) from None
    values = namespace[verb].as_dict() if hasattr(namespace[verb], "as_dict") else dict(namespace[verb])
    values = {k: v for k, v in values.items() if k in verb_flags(verb)}
    if not override_tokens:  # `ablate ui`, `ablate server`: no recipe, so no torch to import (or tear down)
        return verb, values, [], print_config
    from ablate.recipe.resolve import parse_overrides

    return verb, values, parse_overrides(override_tokens), print_config


def _one_line(verb: str, message: str, known: list[str]) -> str:
    """jsonargparse's error (several lines of detail) -> one line naming the flag, the type and the value."""
    from ablate.core.config import describe

    flags = verb_flags(verb)
    key = re.search(r'Parser key "([^"]+)"', message)
    if key and key.group(1) in flags:
        flag = flags[key.group(1)]
        spellings = {"--" + flag.name, "--" + flag.name.replace("_", "-")}
        given = next((known[i + 1] for i in range(len(known) - 1) if known[i] in spellings), None)
        return f"--{flag.name.replace('_', '-')}: expected {describe(flag.hint)}, got {given!r} (see ablate {verb} --help)"
    required = re.search(r"arguments are required: (.*)", message)
    if required:
        names = [n.strip().split(".")[-1] for n in required.group(1).split(",")]
        shown = [n.upper() if n in POSITIONAL else "--" + n.replace("_", "-") for n in names]
        return f"ablate {verb}: {', '.join(shown)} required (see ablate {verb} --help)"
    return f"ablate {verb}: {' '.join(message.split())} (see ablate {verb} --help)"


def print_resolved(recipe: str | None, scale: str | None, overrides: list) -> None:
    """`--print_config`: the recipe resolved at `scale` with the overrides applied, as a recipe file."""
    import yaml

    from ablate.recipe.resolve import resolved_recipe

    if not recipe:
        raise UserError("--print_config: prints a recipe; give one")
    loaded = load(recipe, overrides, scale)
    print(
        f"# resolved by ablate from {loaded.path} at scale {loaded.scale}; "
        "`ablate check FILE` accepts this file as it is"
    )
    print(yaml.safe_dump(resolved_recipe(loaded, scale), sort_keys=False, allow_unicode=True), end="")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        verb, values, overrides, print_config = parse_args(argv)
        if print_config:
            print_resolved(values["recipe"], values.get("scale"), overrides)
            return 0
        if _takes_overrides(verb):
            values["overrides"] = overrides
        return VERBS[verb](**values) or 0
    except UserError as e:
        print(f"ablate: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ablate: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
