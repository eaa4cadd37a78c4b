"""`ablate check` catches the μP inputs `sweep` and `train` would refuse, each one line with the key and what
is allowed, and notes a μP base larger than the model (ablate.model.parametrization.parse and base_model,
ablate.recipe.check.mup_notes). The real CLI on the mini recipe (width 32, head_dim 8, 2 layers)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mini_project import write_recipe

from ablate.cli import main

HERE = Path(__file__).resolve().parent


def _check(capsys, recipe: Path) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["check", str(recipe)])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(code: int, err: str, *fragments: str) -> None:
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert all(f in err for f in fragments), err


MUP = {"name": "mup", "base_d_model": 16}


@pytest.mark.parametrize(
    "parametrization, fragments",
    [
        (
            {**MUP, "base_d_model": 24, "base_head_dim": 16},
            ("model.parametrization.base_d_model: 24 is not a multiple of base_head_dim 16", "16, 32, 48"),
        ),
        ({**MUP, "base_d_model": 10**12}, ("model.parametrization.base_d_model", "from 1 to 1,048,576")),
        ({**MUP, "base_n_layers": 0}, ("model.parametrization.base_n_layers", "from 1 to 1,048,576")),
    ],
    ids=["not-a-multiple-of-the-head-dim", "huge", "no-layers"],
)
def test_a_base_shape_outside_its_range_is_one_line(tmp_path, capsys, parametrization, fragments):
    recipe = write_recipe(tmp_path, base__model__parametrization=parametrization)
    _one_line(*_check(capsys, recipe)[::2], *fragments)


@pytest.mark.parametrize(
    ("norm", "fragments"),
    [
        ("test_unroled_norm", ("UnroledNorm does not declare parameter 'shift'", "parameter_roles")),
        (
            "test_wide_only_norm",
            (
                "model.parametrization.base_d_model: the base model (d_model 16, head_dim 8) cannot be built",
                "ValueError: WideOnlyNorm needs dim >= 32, got 16",
            ),
        ),
    ],
    ids=["an-undeclared-parameter-role", "a-component-refusing-the-base-width"],
)
def test_a_plugin_norm_mup_cannot_use_is_one_line_in_check(tmp_path, capsys, monkeypatch, norm, fragments):
    monkeypatch.syspath_prepend(str(HERE))
    recipe = write_recipe(
        tmp_path,
        imports=["mup_plugin_example"],
        base__model__parametrization=MUP,
        base__model__norm={"name": norm},
    )
    _one_line(*_check(capsys, recipe)[::2], *fragments)


def test_a_base_larger_than_the_model_is_noted(tmp_path, capsys):
    recipe = write_recipe(tmp_path, base__model__parametrization={**MUP, "base_d_model": 4096})
    code, out, err = _check(capsys, recipe)
    assert code == 0, err
    notes = [line for line in out.splitlines() if "is larger than the model" in line]
    assert notes and "base (d_model 4096, n_layers 2)" in notes[0] and "(d_model 32, n_layers 2)" in notes[0]
    recipe = write_recipe(tmp_path, base__model__parametrization=MUP)  # a base below the model: no note
    code, out, err = _check(capsys, recipe)
    assert code == 0 and "is larger than the model" not in out, err
