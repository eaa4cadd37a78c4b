"""How the command line reads argv (ablate.cli, ablate.core.argv): the spellings of a flag, bare booleans,
lists, and recipe overrides kept wherever they stand, as `parse_args` returns them (no recipe is loaded)."""

from __future__ import annotations

import pytest
from cli_helpers import assert_one_line_error, run_cli

from ablate.cli import parse_args

RECIPE = "recipes/table6.yaml"


@pytest.mark.parametrize("spelling", ["--allow-unmatched", "--allow_unmatched"])
def test_a_flag_is_spelled_with_dashes_or_underscores_and_a_bare_boolean_is_true(spelling):
    _, values, _, _ = parse_args(["check", RECIPE, spelling, "--coord-steps", "3"])
    assert (values["allow_unmatched"], values["coord_steps"]) == (True, 3)
    _, values, _, _ = parse_args(["check", RECIPE, spelling, "false"])
    assert values["allow_unmatched"] is False
    _, values, _, _ = parse_args(["check", RECIPE, f"{spelling}=true"])
    assert values["allow_unmatched"] is True


def test_a_bare_boolean_before_the_recipe_leaves_it_the_recipe():
    _, values, _, _ = parse_args(["sweep", "--yes", RECIPE, "--no-train", "true"])
    assert (values["recipe"], values["yes"], values["no_train"]) == (RECIPE, True, True)
    _, values, _, _ = parse_args(["check", "--allow-unmatched", "false", RECIPE])
    assert (values["recipe"], values["allow_unmatched"]) == (RECIPE, False)


def test_a_list_takes_the_values_after_it_up_to_the_next_flag():
    verb, values, overrides, _ = parse_args(
        ["sweep", RECIPE, "--seeds", "0", "1", "2", "--yes", "--workers", "2"]
    )
    assert (verb, values["seeds"], values["yes"], values["workers"], overrides) == (
        "sweep",
        [0, 1, 2],
        True,
        2,
        [],
    )


def test_overrides_are_kept_wherever_they_stand_in_every_form():
    _, values, overrides, print_config = parse_args(
        [
            "check",
            "--base.train.lr",
            "3e-4",
            RECIPE,
            "--scale",
            "tiny",
            "base.train.steps=7",
            "--variants.diff.label=D x",
            "--print-config",
        ]
    )
    assert (values["recipe"], values["scale"], print_config) == (RECIPE, "tiny", True)
    assert overrides == [("base.train.lr", 3e-4), ("variants.diff.label", "D x"), ("base.train.steps", 7)]
    _, _, overrides, _ = parse_args(["check", RECIPE, "--base.train.lr", "-1e-3", "--base.model.x", "-2"])
    assert overrides == [("base.train.lr", -1e-3), ("base.model.x", -2)]
    _, values, overrides, _ = parse_args(["bench", "--base.train.lr", "0.5"])  # the recipe stays its default
    assert (values["recipe"], overrides) == (RECIPE, [("base.train.lr", 0.5)])


def test_a_flags_dotted_sub_key_is_a_recipe_override_not_the_flag():
    _, values, overrides, _ = parse_args(
        ["sweep", RECIPE, "--launcher.slurm.partition", "gpu", "--launcher", "slurm"]
    )
    assert (values["launcher"], overrides) == ("slurm", [("launcher.slurm.partition", "gpu")])


def test_a_flag_is_never_abbreviated_and_a_keyword_parameter_drops_its_underscore():
    _, values, overrides, _ = parse_args(["check", RECIPE, "--scal", "tiny"])
    assert (values["scale"], overrides) == (None, [("scal", "tiny")])
    _, values, _, _ = parse_args(["fit", "--from", "reports/x/"])
    assert values["from_"] == "reports/x/"


def test_components_help_with_a_name_is_that_components_options():
    _, values, _, _ = parse_args(["components", "--help", "diff"])
    assert values["options"] == "diff"


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["ui", "--port", "many"], ["--port: expected int, got 'many'", "(see ablate ui --help)"]),
        (["ui", "--base.train.lr", "1"], ["ablate ui: unexpected arguments --base.train.lr 1"]),
        (["sweep", RECIPE, "--seeds"], ["--seeds"]),
        (["sweep", RECIPE, "--seeds", "0", "x"], ["--seeds: expected a list of ints or null, got 'x'"]),
        (["train", RECIPE], ["ablate train: --variant required"]),
        (["check", RECIPE, "--base.train.lr"], ["--base.train.lr: needs a value"]),
        (["chek", RECIPE], ["unknown verb 'chek'", "did you mean 'check'"]),
    ],
)
def test_mistakes_on_the_command_line_are_one_line(capsys, argv, fragments):
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, *fragments)
