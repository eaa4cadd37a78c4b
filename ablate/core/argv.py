"""A verb's command line on jsonargparse: its typed options as flags, what they do not name kept as recipe
overrides, jsonargparse's errors in one line.

jsonargparse builds the parser, checks each value against its type and prints the help. Written here is
what it leaves out, each for a reason:
- `VerbParser` keeps a `--flag` the verb does not name, with the value after it (or after `=`), and a
  leftover `key=value` as dotted recipe overrides (`--base.train.lr 3e-4`, `base.train.steps=7`; a prefix
  such as `--scal` too: flags are never abbreviated). jsonargparse has no parse_known_args (on purpose:
  typos would go unnoticed) and would read `--launcher.slurm.partition` as a part of `--launcher`.
- `add_options`: a bare boolean flag means true (`--yes`; `--yes RECIPE` too: `VerbParser._match_argument`
  lets it take only a `true`/`false` after it), a list takes the values after it (`--seeds 0 1 2`),
  a flag is spelled with dashes or underscores (`--allow-unmatched`, `--allow_unmatched`): argparse's nargs
  and aliases, where jsonargparse's own spelling is `--yes true`, `--seeds [0,1,2]`, underscores only.
- `one_line`: jsonargparse's errors run over several lines of detail; a user's mistake is one line.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import json
import math
import re
import typing
from collections.abc import Callable
from typing import Any

from jsonargparse import ArgumentParser

from ablate.core.config import describe, field_docs
from ablate.core.errors import UserError

REQUIRED = inspect.Parameter.empty


@dataclasses.dataclass(frozen=True)
class Option:
    """One option of a verb (a flag, or its positional `recipe`): the parameter, its type, default and help."""

    name: str
    hint: Any
    default: Any  # REQUIRED: none
    help: str
    shared: bool = False  # one several verbs take (ablate.verbs.options.Shared)


def dataclass_options(cls: type) -> list[Option]:
    """A dataclass's fields as options (help from its `Attributes:`)."""
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    return [
        Option(
            f.name,
            hints[f.name],
            REQUIRED
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            else f.default
            if f.default_factory is dataclasses.MISSING
            else f.default_factory(),
            docs.get(f.name, ""),
        )
        for f in dataclasses.fields(cls)
    ]


class Override(argparse.Action):
    """A `--flag` no option of the verb names: a recipe override, kept with its value."""

    def __call__(self, parser, namespace, value, option_string=None):
        if value is None:
            raise UserError(f"{option_string}: needs a value")
        parser.overrides.append(f"{option_string}={value}")


OVERRIDE = Override(option_strings=[], dest="overrides", nargs="?")


class VerbParser(ArgumentParser):
    """One verb's parser; with `takes_overrides`, what its options do not name is kept in `overrides`
    (tokens for ablate.recipe.loading.parse_overrides) and `more_help(parser)` adds to its --help."""

    def __init__(self, *args, takes_overrides: bool, more_help: Callable | None = None, **kwargs) -> None:
        super().__init__(*args, exit_on_error=False, print_config=None, **kwargs)
        self.takes_overrides, self.more_help, self.overrides = takes_overrides, more_help, []

    def _parse_optional(self, arg_string):
        with contextlib.suppress(ValueError):
            float(arg_string)
            return None  # a value (`--base.train.lr -1e-3`), as argparse reads `-1` and `-0.5`
        key, eq, value = arg_string.partition("=")
        if not (self.takes_overrides and key.startswith("--") and key not in self._option_string_actions):
            return super()._parse_optional(arg_string)
        # argparse's own answer for a flag it knows (its shape differs between Python versions), renamed
        parsed = argparse.ArgumentParser._parse_optional(self, "--print_config" + eq + value)
        renamed = [(OVERRIDE, key, *p[2:]) for p in (parsed if isinstance(parsed, list) else [parsed])]
        return renamed if isinstance(parsed, list) else renamed[0]

    def _match_argument(self, action, pattern):
        """A bare boolean flag takes a `true`/`false` after it, never the recipe (`--yes RECIPE`)."""
        at = len(self.argv) - len(pattern)  # the argument after the flag (the pattern: one letter each)
        if (
            action.const is True
            and pattern[:1] == "A"
            and 0 < at
            and self.argv[at - 1] in action.option_strings
        ):
            if self.argv[at].lower() not in ("true", "false"):
                return 0
        return super()._match_argument(action, pattern)

    def _parse_known_args_internal(self, args=None, namespace=None, **kwargs):
        self.argv = list(args or [])
        namespace, unknown = super()._parse_known_args_internal(args, namespace, **kwargs)
        if self.takes_overrides:
            self.overrides, unknown = self.overrides + unknown, []
        return namespace, unknown

    def format_help(self) -> str:
        if self.more_help is not None:  # once: options shown in --help only (given, they are overrides)
            self.more_help, more_help = None, self.more_help
            more_help(self)
        return super().format_help()


class HelpOr(argparse.Action):
    """`--help`, or given a value the verb's `help_option` (`ablate components --help diff`)."""

    def __call__(self, parser, namespace, value, option_string=None):
        if value is None:
            parser.print_help()
            parser.exit()
        setattr(namespace, self.dest, value)


def add_options(parser: VerbParser, options: list[Option], help_option: str | None = None) -> None:
    """The options as arguments: `recipe` the positional, every other one a flag; the shared ones in a
    group of their own; `--print_config` where the verb takes overrides; `--help NAME` where it names a
    `help_option`."""
    shared = parser.add_argument_group("options shared with other verbs (ablate.verbs.options.Shared)")
    for option in options:
        where, required = shared if option.shared else parser, option.default is REQUIRED
        kwargs: dict[str, Any] = {"type": option.hint, "help": option.help}
        kwargs |= {} if required else {"default": option.default}
        if option.name == "recipe":
            where.add_argument("recipe", **kwargs, **({} if required else {"nargs": "?"}))
            continue
        inner = [a for a in typing.get_args(option.hint) if a is not type(None)]
        inner = inner[0] if len(inner) == 1 else option.hint
        if inner is bool:
            kwargs |= {"nargs": "?", "const": True}
        elif typing.get_origin(inner) is list:
            kwargs |= {"nargs": "+", "type": typing.get_args(inner)[0]}
        flag = option.name.rstrip("_")  # `from_` (a Python keyword's parameter) is `--from`
        names = dict.fromkeys(["--" + flag.replace("_", "-"), "--" + flag])
        where.add_argument(*names, dest=option.name, required=required, **kwargs)
    if parser.takes_overrides:
        parser.add_argument(
            *("--print_config", "--print-config"),
            **{"type": bool, "nargs": "?", "const": True, "default": False},
            help="print the resolved recipe (a file `ablate check` accepts as it is) and exit",
        )
    if help_option:
        parser.add_argument(
            *("-h", "--help"),
            **{"action": HelpOr, "nargs": "?", "dest": help_option, "default": argparse.SUPPRESS},
            help=f"show this help message and exit; --help NAME: --{help_option} NAME",
        )


def one_line(verb: str | None, message: str, options: list[Option]) -> str:
    """jsonargparse's error (several lines of detail) -> one line naming the flag, the type and the value."""
    see = f" (see ablate {verb} --help)" if verb else " (see ablate --help)"
    by_name = {o.name: o for o in options}
    key, got = re.search(r'Parser key "([^"]+)"', message), re.search(r"(?:Got|Given) value: (.*)", message)
    if key and key.group(1) in by_name:
        option = by_name[key.group(1)]
        value = repr(got.group(1)) if got else "nothing it reads"
        return f"--{option.name.replace('_', '-')}: expected {describe(option.hint)}, got {value}{see}"
    required = re.search(r"arguments are required: (.*)", message)
    if required:
        names = [n.strip().split(".")[-1] for n in required.group(1).split(",")]
        shown = [n.upper() if n == "recipe" else "--" + n.replace("_", "-") for n in names]
        return f"ablate {verb}: {', '.join(shown)} required{see}"
    message = " ".join(message.split()).replace("unrecognized arguments:", "unexpected arguments")
    return f"ablate{' ' + verb if verb else ''}: {message}{see}"


def override_argv(overrides: list) -> list[str]:
    """The overrides as `--key=value` words (a printed worker command, a local worker's arguments) that
    `ablate.recipe.loading.parse_overrides` reads back as the same values (override_text)."""
    return [f"--{key}={override_text(value)}" for key, value in overrides]


def override_text(value: Any) -> str:
    """`value` as YAML flow text that the overrides' YAML reader loads back equal: JSON's text for what JSON
    writes as YAML reads it (strings quoted, so `"3e-4"` or `"yes"` stays a string), and YAML's `.inf`,
    `-.inf` and `.nan` for what JSON would write as `Infinity` and `NaN` (YAML reads those as strings)."""
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    if isinstance(value, dict):
        return "{" + ", ".join(f"{override_text(k)}: {override_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(override_text(v) for v in value) + "]"
    return json.dumps(value)
