"""The command line: argv -> one verb of `ablate.verbs`, parsed by jsonargparse from the verb's typed function.

`VERBS` is the table of verbs (litgpt's dict of functions). A verb's signature and docstring are its options
(type, default, one-line help in `ablate <verb> --help`: ablate.verbs.options.verb_options reads them), and
jsonargparse builds one subcommand per verb from them, checks the types and prints the help (what it leaves
out, and why: ablate.core.argv). Only the verb named is built in full and heavy imports happen inside the
verbs, so `ablate --help` is instant. What the verb's options do not name is a dotted recipe override
(`--base.train.lr 3e-4`, `--variants.diff.model.attention.per_head_norm false`, `base.train.steps=7`),
checked against the recipe's types when the recipe loads; `ablate <verb> --help` lists the recipe's
`base.*` options with their types too. `--print_config` (or `--print-config`) prints the resolved recipe,
a file `ablate check` accepts as it is. A `UserError` anywhere becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Callable, Sequence
from typing import Any

from jsonargparse import ArgumentParser

from ablate.core.argv import VerbParser, add_options, one_line
from ablate.core.errors import UserError
from ablate.store.write_failure import store_write_failure
from ablate.verbs.bench import bench
from ablate.verbs.check import check
from ablate.verbs.components import components
from ablate.verbs.eval import evaluate
from ablate.verbs.export import export
from ablate.verbs.fit import fit
from ablate.verbs.options import print_resolved, verb_options
from ablate.verbs.prepare import prepare
from ablate.verbs.recipe_help import add_recipe_help
from ablate.verbs.report import report
from ablate.verbs.server import server
from ablate.verbs.status import status
from ablate.verbs.sweep import sweep
from ablate.verbs.train import train
from ablate.verbs.ui import ui
from ablate.verbs.worker import worker

VERBS: dict[str, Callable[..., int]] = {
    **{"components": components, "check": check, "train": train, "sweep": sweep, "worker": worker},
    **{"status": status, "report": report, "fit": fit, "bench": bench, "prepare": prepare},
    **{"eval": evaluate, "export": export, "ui": ui, "server": server},
}
OVERRIDES_USAGE = "[--base.SECTION.KEY VALUE ...] [--variants.VARIANT.SECTION.KEY VALUE ...]"


def build_parser(verb: str | None = None) -> tuple[ArgumentParser, VerbParser | None]:
    """jsonargparse's parser, one subcommand per verb, and the named `verb`'s, built with its options."""
    from ablate import __version__

    parser = ArgumentParser(
        prog="ablate",
        description="Declarative architecture ablations of decoder language models: ablate <verb> --help "
        "for each verb's options. There is no --config FILE: the recipe (the first argument of every verb "
        "that trains) is the config file, and --print_config writes one resolved, with the overrides applied.",
        exit_on_error=False,
        allow_abbrev=False,
        version=__version__,
    )
    subcommands, chosen = parser.add_subcommands(dest="verb", required=True), None
    for name, fn in VERBS.items():
        summary = " ".join((inspect.getdoc(fn) or "").split("\n\n")[0].split())  # the first paragraph
        takes = "overrides" in inspect.signature(fn).parameters
        sub = VerbParser(
            prog=f"ablate {name}",
            description=summary,
            usage=f"ablate {name} [options] {OVERRIDES_USAGE}" if takes and name == verb else None,
            takes_overrides=takes,
            more_help=add_recipe_help if takes else None,
            add_help=not hasattr(fn, "help_option"),
        )
        if name == verb:
            add_options(sub, verb_options(fn), getattr(fn, "help_option", None))
            chosen = sub
        subcommands.add_subcommand(name, sub, help=summary)
    return parser, chosen


def parse_args(argv: Sequence[str]) -> tuple[str, dict[str, Any], list, bool]:
    """argv -> (verb, its keyword arguments, recipe overrides as (dotted key, value), print_config)."""
    verb = next((a for a in argv if not a.startswith("-")), None)  # the one subcommand built in full
    if verb is not None and verb not in VERBS:
        from ablate.core.errors import closest

        raise UserError(f"ablate: unknown verb {verb!r}{closest(verb, VERBS)}; verbs: {', '.join(VERBS)}")
    parser, sub = build_parser(verb)
    options = verb_options(VERBS[verb]) if verb else []
    try:
        namespace = parser.parse_args(list(argv) or ["--help"])
    except (argparse.ArgumentError, KeyError, ValueError, TypeError) as e:  # jsonargparse's, and its checks'
        raise UserError(one_line(verb, str(e), options)) from None
    given = namespace[namespace.verb]
    values = {o.name: given[o.name] for o in options if o.name in given}
    from ablate.recipe.loading import parse_overrides

    overrides = parse_overrides(sub.overrides) if sub.overrides else []
    return namespace.verb, values, overrides, bool(given.get("print_config"))


def main(argv: Sequence[str] | None = None) -> int:
    try:
        verb, values, overrides, print_config = parse_args(list(sys.argv[1:] if argv is None else argv))
        if print_config:
            print_resolved(values["recipe"], values.get("scale"), overrides)
            return 0
        if "overrides" in inspect.signature(VERBS[verb]).parameters:
            values["overrides"] = overrides
        return VERBS[verb](**values) or 0
    except KeyboardInterrupt:
        print("ablate: interrupted", file=sys.stderr)
        return 130
    except (
        Exception
    ) as e:  # a UserError, or a write the store's disk refused, is one line; a bug its traceback
        failure = e if isinstance(e, UserError) else store_write_failure(e)
        if failure is None:
            raise
        print(f"ablate: error: {failure}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
