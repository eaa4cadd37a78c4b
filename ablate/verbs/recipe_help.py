"""The recipe's `base.*` options in a verb's `--help`: each section's keys with their types and defaults
(given on the command line, they are dotted overrides)."""

from __future__ import annotations

from ablate.core.argv import REQUIRED, VerbParser, dataclass_options


def add_recipe_help(parser: VerbParser) -> None:
    """The recipe's base.* options, with their types and defaults, for --help (given, they are overrides)."""
    from ablate.core.registry import Spec
    from ablate.data.config import DataConfig
    from ablate.model.config import ModelConfig
    from ablate.train.config import TrainConfig

    for section, cls in (("model", ModelConfig), ("train", TrainConfig), ("data", DataConfig)):
        group = parser.add_argument_group(
            f"recipe options: base.{section} (dotted overrides, applied to every run; "
            f"also --variants.KEY.{section}.OPTION)"
        )
        for o in dataclass_options(cls):
            note = " (required in the recipe)" if o.default is REQUIRED else ""
            note += " (a component spec: name, {name: ..., <options>} or class_path/init_args)" * (
                o.hint == Spec
            )
            default = None if o.default is REQUIRED else o.default
            group.add_argument(
                f"--base.{section}.{o.name}",
                type=o.hint,
                default=default,
                metavar="VALUE",
                help=o.help + note,
            )
