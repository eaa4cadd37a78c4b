"""The component registry: kinds, names, duplicate names, build-time checks, `ablate components`."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, run_cli
from torch import nn

from ablate.core import registry
from ablate.core.errors import UserError
from components.attention.diff import DiffAttention
from components.attention.softmax import SoftmaxAttention
from components.norm import RMSNorm

HERE = Path(__file__).parent


@pytest.fixture
def scratch_registry(monkeypatch):
    """A copy of the registry for this test, so test registrations never leak into other tests."""
    registry.load_plugins()
    monkeypatch.setattr(
        registry, "_REGISTRY", {kind: dict(names) for kind, names in registry._REGISTRY.items()}
    )
    return registry._REGISTRY


def table_rows(text: str) -> list[list[str]]:
    """The body rows of the Markdown table in `text` (header and rule left out)."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


# --- kinds and names -------------------------------------------------------------------------------


def test_register_under_unknown_kind_raises():
    with pytest.raises(ValueError, match="unknown component kind 'atention'"):
        registry.register("atention", "x")


def test_get_unknown_kind_is_a_user_error_listing_kinds():
    with pytest.raises(UserError, match="unknown component kind 'bogus'; kinds are attention, norm"):
        registry.get("bogus", "x")


def test_builtins_are_registered_by_name():
    assert registry.get("attention", "softmax") is SoftmaxAttention
    assert registry.get("attention", "diff") is DiffAttention
    assert registry.get("norm", "rmsnorm") is RMSNorm
    kinds_with_entries = {e.kind for e in registry.entries()}
    assert kinds_with_entries == set(registry.KINDS)  # every kind has built-ins (tasks and probes included)


def test_unknown_name_lists_known_names_and_closest_match():
    with pytest.raises(UserError) as info:
        registry.get("attention", "dif", key="model.attention.name")
    message = str(info.value)
    assert message.startswith("model.attention.name: unknown attention 'dif'")
    assert "(did you mean 'diff'?)" in message
    known = message.split("known: ", 1)[1].split(", ")
    assert {"diff", "softmax"} <= set(known)


def test_unknown_name_without_close_match_has_no_hint():
    with pytest.raises(UserError) as info:
        registry.get("norm", "zzzzzz")
    assert "did you mean" not in str(info.value)
    assert "rmsnorm" in str(info.value)


def test_duplicate_registration_of_a_different_class_raises(scratch_registry):
    @registry.register("attention", "dup_test")
    class First(nn.Module):
        """First."""

    class Second(nn.Module):
        """Second."""

    with pytest.raises(ValueError, match="attention 'dup_test' is already registered by .*First"):
        registry.register("attention", "dup_test")(Second)
    assert registry.get("attention", "dup_test") is First  # the failed attempt changed nothing
    with pytest.raises(ValueError, match="already registered"):
        registry.register("attention", "diff")(Second)  # built-ins are protected too
    assert registry.get("attention", "diff") is DiffAttention


def test_registering_the_same_class_twice_is_harmless(scratch_registry):
    class Same(nn.Module):
        """Same."""

    registry.register("ffn", "same_test")(Same)
    assert registry.register("ffn", "same_test")(Same) is Same
    assert registry.get("ffn", "same_test") is Same
    assert (Same.registry_kind, Same.registry_name) == ("ffn", "same_test")


def test_a_name_is_per_kind(scratch_registry):
    class NormX(nn.Module):
        """A norm called softmax."""

    registry.register("norm", "softmax")(NormX)  # no clash with attention 'softmax'
    assert registry.get("norm", "softmax") is NormX
    assert registry.get("attention", "softmax") is SoftmaxAttention


# --- descriptions ----------------------------------------------------------------------------------


def test_entry_description_is_the_first_docstring_line():
    class Documented(nn.Module):
        """First line.

        More text that `ablate components` must not print.
        """

    entry = registry.Entry("attention", "documented", Documented)
    assert entry.description == "First line."
    assert entry.class_path.endswith("Documented")


def test_entry_description_of_an_undocumented_class_is_empty():
    """A plugin without a docstring must not be described with nn.Module's inherited docstring."""

    class Undocumented(nn.Module):
        pass

    assert registry.Entry("attention", "undocumented", Undocumented).description == ""


# --- build: injection and option checks ------------------------------------------------------------


def test_build_injects_only_the_structure_a_constructor_accepts():
    norm = registry.build("norm", "rmsnorm", dim=12, d_model=999, layer_idx=3)
    assert isinstance(norm, RMSNorm)
    assert norm.weight.shape == (12,)


def test_build_passes_recipe_options():
    norm = registry.build("norm", {"name": "rmsnorm", "eps": 0.125}, dim=4)
    assert norm.eps == 0.125
    attention = registry.build("attention", {"name": "softmax", "head_dim_mult": 2}, d_model=32, head_dim=4)
    assert (attention.n_heads, attention.head_width) == (4, 8)


def test_build_rejects_an_unknown_option_with_hint():
    with pytest.raises(UserError) as info:
        registry.build(
            "attention",
            {"name": "diff", "per_head_nrom": True},
            key="model.attention",
            d_model=32,
            head_dim=4,
        )
    message = str(info.value)
    assert message.startswith("model.attention.per_head_nrom:")
    assert "did you mean 'per_head_norm'?" in message
    assert "d_model" not in message.split("options:")[1]  # injected names are not recipe options


def test_build_rejects_a_structure_key_in_the_recipe():
    with pytest.raises(UserError, match=r"model.attention.d_model: set by the model"):
        registry.build(
            "attention", {"name": "softmax", "d_model": 64}, key="model.attention", d_model=32, head_dim=4
        )


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("per_head_norm", "yes", "expected bool"),
        ("norm_eps", "small", "expected float"),
        ("head_dim_mult", 2.5, "expected int"),
        ("head_dim_mult", True, "expected int"),
    ],
)
def test_build_checks_simple_option_types(option, value, expected):
    with pytest.raises(UserError, match=f"model.attention.{option}: {expected}"):
        registry.build(
            "attention", {"name": "softmax", option: value}, key="model.attention", d_model=32, head_dim=4
        )


def test_build_accepts_an_int_for_a_float_option():
    norm = registry.build("norm", {"name": "rmsnorm", "eps": 1}, dim=4)
    assert norm.eps == 1


def test_class_path_spec_builds_an_unregistered_class():
    module = registry.build("norm", {"class_path": "torch.nn.Identity", "init_args": {}}, dim=4)
    assert isinstance(module, nn.Identity)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        (
            {"class_path": "no_such_module_xyz.Thing"},
            "model.norm.class_path: cannot import 'no_such_module_xyz.Thing'",
        ),
        (
            {"class_path": "torch.nn.Identity", "eps": 1},
            "model.norm: with class_path only init_args may be given",
        ),
        (42, "model.norm: expected a norm name"),
        ({"eps": 1e-6}, "model.norm: expected a norm name"),
    ],
)
def test_malformed_specs_are_user_errors(spec, fragment):
    with pytest.raises(UserError) as info:
        registry.build("norm", spec, key="model.norm", dim=4)
    assert fragment in str(info.value)


# --- `ablate components` ---------------------------------------------------------------------------


def test_components_lists_every_kind_with_class_and_description(capsys):
    code, out, err = run_cli(capsys, "components")
    assert code == 0, err
    header = [c.strip() for c in out.splitlines()[0].strip("|").split("|")]
    assert header == ["kind", "name", "class", "description"]
    rows = {(r[0], r[1]): r for r in table_rows(out)}
    assert {kind for kind, _ in rows} == set(registry.KINDS)
    assert rows["attention", "diff"][2] == "components.attention.diff.DiffAttention"
    assert rows["attention", "diff"][3].startswith("Differential attention")
    assert rows["norm", "rmsnorm"][2] == "components.norm.RMSNorm"
    assert rows["lambda_init", "exp_depth"][3].startswith("λ_init = 0.8 - 0.6 exp(-0.3 (l - 1))")
    for kind, name in [("ffn", "swiglu"), ("position", "rope"), ("lambda_init", "constant")]:
        assert rows[kind, name][3], f"{kind} {name} has no description"


def test_components_kind_filter(capsys):
    code, out, err = run_cli(capsys, "components", "--kind", "attention")
    assert code == 0, err
    rows = table_rows(out)
    assert rows and all(r[0] == "attention" for r in rows)
    assert {"diff", "softmax"} <= {r[1] for r in rows}
    assert [r[1] for r in rows] == sorted(r[1] for r in rows)


def test_components_lists_a_plugin_given_with_imports(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    code, out, err = run_cli(capsys, "components", "--kind", "attention", "--imports", "plugin_example")
    assert code == 0, err
    rows = {r[1]: r for r in table_rows(out)}
    assert rows["test_local_attention"][2] == "plugin_example.LocalAttention"
    assert rows["test_local_attention"][3].startswith("Sliding-window causal softmax attention")


def test_components_unknown_kind_exits_2(capsys):
    code, out, err = run_cli(capsys, "components", "--kind", "bogus")
    assert_one_line_error(
        code, err, "--kind", "'bogus'", "kinds are attention, norm, lambda_init, ffn, position"
    )


def test_components_misspelt_kind_suggests_the_closest(capsys):
    code, out, err = run_cli(capsys, "components", "--kind", "atention")
    assert_one_line_error(code, err, "--kind", "did you mean 'attention'?")


def test_components_unimportable_plugin_exits_2(capsys):
    code, out, err = run_cli(capsys, "components", "--imports", "no_such_plugin_module_xyz")
    assert_one_line_error(code, err, "imports: cannot import 'no_such_plugin_module_xyz'")


def test_every_built_in_option_has_a_help_line():
    registry.load_plugins()
    missing = [
        f"{entry.kind} {entry.name}: {option.name}"
        for entry in registry.entries()
        if entry.cls.__module__.startswith("components.")  # the built-in zoo, not a test's registrations
        for option in registry.options_of(entry.cls)
        if not option.help
    ]
    assert not missing


def test_option_helps_come_from_the_class_docstring_or_init_not_from_nn_module():
    class ClassDoc(nn.Module):
        """A module documented on the class.

        Args:
            width: how wide it is
        """

        def __init__(self, *, width: int = 2):
            super().__init__()

    class InitDoc(nn.Module):
        """A module documented in __init__."""

        def __init__(self, *, width: int = 2, depth: int = 1):
            """Build it.

            Args:
                width: the width
                depth: the depth
            """
            super().__init__()

    class Undocumented(nn.Module):
        def __init__(self, *, width: int = 2):
            super().__init__()

    def helps(cls):
        return {o.name: o.help for o in registry.options_of(cls)}

    assert helps(ClassDoc) == {"width": "how wide it is"}
    assert helps(InitDoc) == {"width": "the width", "depth": "the depth"}
    assert helps(Undocumented) == {"width": ""}
