"""Recipe loading: user errors (exit 2, one line naming the key), merging, scales and overrides."""

from __future__ import annotations

import copy
import re
import tempfile
from pathlib import Path

import pytest
import yaml
from cli_helpers import TABLE6_VARIANTS, assert_one_line_error, run_cli

from ablate.core.config import deep_merge, set_dotted
from ablate.core.errors import UserError
from ablate.recipe.loading import load_recipe, parse_overrides
from ablate.recipe.resolve import resolved_recipe

ROOT = Path(__file__).resolve().parents[2]
TABLE6 = ROOT / "recipes" / "table6.yaml"

TINY = {
    "name": "tiny_test",
    "base": {
        "model": {
            "vocab_size": 64,
            "d_model": 32,
            "n_layers": 2,
            "head_dim": 8,
            "attention": {"name": "softmax", "head_dim_mult": 2},
        },
        "train": {"seq_len": 16, "batch_tokens": 64, "micro_batch_size": 4, "steps": 2, "lr": 0.001},
        "data": {"source": "stdlib", "tokenizer": {"name": "byte"}},
    },
    "variants": {
        "transformer": {"label": "Transformer"},
        "diff": {"label": "Diff", "model": {"attention": {"name": "diff"}}},
    },
    "scales": {"mini": {"model": {"d_model": 64, "n_layers": 1}, "train": {"steps": 1}}},
}


def recipe_dict(**changes) -> dict:
    """TINY with `changes` applied at `__`-separated paths (base__model__d_model=48); None deletes."""
    raw = copy.deepcopy(TINY)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = raw
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            del node[last]
        else:
            node[last] = value
    return raw


def write(tmp_path: Path, raw: dict | str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
    return path


def printed_runs(out: str) -> dict[str, dict]:
    """`--print-config` output (a recipe) -> {run name: resolved config}, through the recipe loader."""
    with tempfile.TemporaryDirectory() as folder:
        recipe = load_recipe(write(Path(folder), out, "printed.yaml"))
        return {run.name: {"run": run.name, "scale": run.scale, **run.config} for run in recipe.resolve()}


def test_the_tiny_recipe_is_valid(tmp_path, capsys):
    code, out, err = run_cli(capsys, "check", write(tmp_path, TINY))
    assert code == 0, err
    assert err == ""


# --- user errors: one line, exit 2, the key named ---------------------------------------------------


def test_bad_yaml_names_the_line(tmp_path, capsys):
    lines = yaml.safe_dump(TINY, sort_keys=False).splitlines()
    assert lines[3].strip() == "vocab_size: 64"
    lines[3] = "\tvocab_size: 64"  # a tab cannot indent YAML: line 4 is broken
    path = write(tmp_path, "\n".join(lines) + "\n")
    code, out, err = run_cli(capsys, "check", path)
    assert_one_line_error(code, err, "invalid YAML", str(path), "line 4:")


def test_missing_recipe_file(tmp_path, capsys):
    code, out, err = run_cli(capsys, "check", tmp_path / "nope.yaml")
    assert_one_line_error(code, err, "recipe:", "nope.yaml", "is not a file")


ERROR_CASES = [
    ("unknown_top_key", {"bogus": 1}, ["bogus: unknown recipe key", "keys: name, description"]),
    (
        "variant_key_dash",
        {"variants__diff-x": {"label": "X"}},
        ["variants.diff-x: variant keys must be identifiers"],
    ),
    (
        "variant_key_digit",
        {"variants__2diff": {"label": "X"}},
        ["variants.2diff: variant keys must be identifiers"],
    ),
    ("missing_label", {"variants__diff__label": None}, ["variants.diff.label: required"]),
    (
        "unknown_variant_key",
        {"variants__diff__modle": {}},
        ["variants.diff.modle: unknown key", "did you mean 'model'?"],
    ),
    (
        "unknown_model_key",
        {"base__model__d_modle": 32},
        ["model.d_modle: unknown model key", "did you mean 'd_model'?"],
    ),
    (
        "d_model_str",
        {"base__model__d_model": "big"},
        ["model.d_model: expected an integer from 1 to 65,536", "'big'"],
    ),
    ("n_layers_zero", {"base__model__n_layers": 0}, ["model.n_layers: expected an integer from 1 to 1,024"]),
    ("missing_vocab", {"base__model__vocab_size": None}, ["model.vocab_size: required"]),
    ("lr_str", {"base__train__lr": "fast"}, ["train.lr: expected float", "'fast'"]),
    (
        "steps_float",
        {"base__train__steps": 1.5},
        ["train.steps: expected an integer from 1 to 1,000,000,000, got 1.5"],
    ),
    ("unknown_train_key", {"base__train__lrr": 0.1}, ["train.lrr: unknown key", "did you mean 'lr'?"]),
    (
        "bad_precision",
        {"base__train__precision": "bf15-mixed"},
        ["train.precision: 'bf15-mixed' is not one of"],
    ),
    (
        "head_dim_not_dividing",
        {"base__model__head_dim": 12},
        ["model.head_dim: 12 does not divide d_model 32"],
    ),
    (
        "scale_changes_attention",
        {"scales__tiny": {"model": {"attention": {"name": "diff"}}}},
        ["scales.tiny.model.attention: scales change sizes only"],
    ),
    (
        "scale_changes_ffn",
        {"scales__tiny": {"model": {"ffn": {"name": "gelu"}}}},
        ["scales.tiny.model.ffn: scales change sizes only"],
    ),
    (
        "unknown_attention",
        {"variants__diff__model__attention": {"name": "dif"}},
        ["model.attention.name: unknown attention 'dif'", "did you mean 'diff'?"],
    ),
    (
        "unknown_attention_option",
        {"variants__diff__model__attention": {"name": "diff", "per_head_nrom": False}},
        ["model.attention.per_head_nrom", "did you mean 'per_head_norm'?"],
    ),
    (
        "attention_option_type",
        {"variants__diff__model__attention": {"name": "diff", "per_head_norm": "no"}},
        ["model.attention.per_head_norm: expected bool"],
    ),
    ("negative_seed", {"seeds": [0, -1]}, ["seeds: expected a list of non-negative integers", "[0, -1]"]),
    (
        "bad_tolerance",
        {"tolerance": {"param": 0.02}},
        ["tolerance.param: unknown key", "did you mean 'params'?"],
    ),
    ("no_variants", {"variants": {}}, ["variants: required mapping of at least one variant"]),
    ("missing_data", {"base__data": None}, ["base.data: required section missing"]),
    (
        "bad_import",
        {"imports": ["no_such_plugin_module_xyz"]},
        ["imports: cannot import 'no_such_plugin_module_xyz'"],
    ),
]


@pytest.mark.parametrize(("changes", "fragments"), [pytest.param(c, f, id=i) for i, c, f in ERROR_CASES])
def test_recipe_user_errors_are_one_line_naming_the_key(tmp_path, capsys, changes, fragments):
    code, out, err = run_cli(capsys, "check", write(tmp_path, recipe_dict(**changes)))
    assert_one_line_error(code, err, *fragments)


def test_recipe_that_is_not_a_mapping(tmp_path, capsys):
    code, out, err = run_cli(capsys, "check", write(tmp_path, "- a\n- b\n"))
    assert_one_line_error(code, err, "must hold a mapping with base and variants")


def test_bad_default_scale_names_the_recipe_key(tmp_path, capsys):
    """The user did not pass --scale: the error must point at `default_scale:` in the recipe."""
    code, out, err = run_cli(capsys, "check", write(tmp_path, recipe_dict(default_scale="mnii")))
    assert_one_line_error(code, err, "default_scale", "'mnii'", "did you mean 'mini'?")


def test_imports_given_as_one_string(tmp_path, capsys, monkeypatch):
    """`imports: plugin_example` (no list) must import that module or say a list is expected, not try 'p'."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    code, out, err = run_cli(capsys, "check", write(tmp_path, recipe_dict(imports="plugin_example")))
    if code != 0:
        assert_one_line_error(code, err, "imports", "list")


def test_unknown_scale_on_the_command_line(capsys):
    code, out, err = run_cli(capsys, "check", TABLE6, "--scale", "tiyn")
    assert_one_line_error(
        code,
        err,
        "--scale: unknown scale 'tiyn'",
        "did you mean 'tiny'?",
        "scales: cpu, cpu-pypi, cpu-pypi-mup, cpu-pypi-mup-edge, cpu-pypi-mup-heldout, cpu-pypi-mup-pair, "
        "cpu-pypi-mup-wsd, cpu-tokens, cpu-tokens-pypi, paper, small, tiny",
    )


def test_unknown_cli_flag_is_one_line(capsys):
    code, out, err = run_cli(capsys, "check", TABLE6, "--scale")
    assert_one_line_error(code, err, "--scale")


# --- merging ----------------------------------------------------------------------------------------


def test_variant_naming_another_component_does_not_inherit_options(tmp_path):
    runs = {r.variant: r for r in load_recipe(write(tmp_path, TINY)).resolve()}
    assert runs["transformer"].config["model"]["attention"] == {"name": "softmax", "head_dim_mult": 2}
    assert runs["diff"].config["model"]["attention"] == {"name": "diff"}  # no head_dim_mult from softmax


def test_variant_without_a_name_merges_into_the_base_component(tmp_path):
    raw = recipe_dict(variants__gn={"label": "GN", "model": {"attention": {"per_head_norm": True}}})
    runs = {r.variant: r for r in load_recipe(write(tmp_path, raw)).resolve()}
    assert runs["gn"].config["model"]["attention"] == {
        "name": "softmax",
        "head_dim_mult": 2,
        "per_head_norm": True,
    }


def test_deep_merge_rules():
    base = {
        "model": {
            "d_model": 32,
            "attention": {
                "name": "diff",
                "per_head_norm": True,
                "lambda_init": {"name": "constant", "value": 0.5},
            },
        }
    }
    # same component: options merge, nested component with another name is replaced
    merged = deep_merge(base, {"model": {"attention": {"lambda_init": {"name": "exp_depth"}}}})
    assert merged["model"]["attention"] == {
        "name": "diff",
        "per_head_norm": True,
        "lambda_init": {"name": "exp_depth"},
    }
    assert merged["model"]["d_model"] == 32
    # another component by class_path replaces the spec
    merged = deep_merge(base, {"model": {"attention": {"class_path": "x.Y"}}})
    assert merged["model"]["attention"] == {"class_path": "x.Y"}
    # the result shares nothing with the inputs: changing it changes neither
    overlay = {"model": {"attention": {"per_head_norm": False, "lambda_init": {"value": 0.7}}}}
    merged = deep_merge(base, overlay)
    assert merged["model"]["attention"]["lambda_init"] == {"name": "constant", "value": 0.7}
    merged["model"]["attention"]["lambda_init"]["value"] = 9
    merged["model"]["d_model"] = 1
    assert base["model"]["attention"]["lambda_init"]["value"] == 0.5
    assert base["model"]["d_model"] == 32
    assert overlay["model"]["attention"]["lambda_init"] == {"value": 0.7}


def test_scale_changes_sizes_and_keeps_each_variants_relation(tmp_path):
    recipe = load_recipe(write(tmp_path, TINY))
    runs = {r.variant: r for r in recipe.resolve("mini")}
    for run in runs.values():
        assert run.scale == "mini"
        assert (run.config["model"]["d_model"], run.config["model"]["n_layers"]) == (64, 1)
        assert run.config["train"]["steps"] == 1
        assert run.config["train"]["lr"] == 0.001  # kept from base
    assert runs["transformer"].model.attention == {"name": "softmax", "head_dim_mult": 2}
    assert runs["diff"].model.attention == {"name": "diff"}


def test_table6_tiny_scale_keeps_the_table6_relations():
    runs = {r.variant: r for r in load_recipe(TABLE6).resolve("tiny")}
    assert len(runs) == 7
    for run in runs.values():
        model = run.config["model"]
        assert (model["vocab_size"], model["d_model"], model["n_layers"], model["head_dim"]) == (
            2048,
            128,
            4,
            16,
        )
        assert run.config["train"]["seq_len"] == 256
    assert runs["transformer_d256"].model.attention["head_dim_mult"] == 2
    assert runs["diff_lambda_05"].model.attention["lambda_init"] == {"name": "constant", "value": 0.5}


def test_resolved_runs_list_every_key(tmp_path):
    (run, *_) = load_recipe(write(tmp_path, TINY)).resolve()
    model = run.config["model"]
    assert {
        "attention_backend",
        "tie_embeddings",
        "init_std",
        "zero_init_residual",
        "norm",
        "ffn",
        "position",
    } <= set(model)
    assert {"betas", "weight_decay", "warmup_steps", "precision"} <= set(run.config["train"])
    assert run.config["train"]["betas"] == [0.9, 0.98]


# --- overrides --------------------------------------------------------------------------------------


def test_base_override_applies_to_every_run_api(tmp_path):
    recipe = load_recipe(write(tmp_path, TINY), [("base.train.lr", 1e-3 / 2)])
    runs = recipe.resolve()
    assert len(runs) == 2
    assert all(run.config["train"]["lr"] == 5e-4 for run in runs)
    assert load_recipe(write(tmp_path, TINY)).resolve()[0].config["train"]["lr"] == 0.001


def test_base_override_wins_over_the_scale(tmp_path):
    recipe = load_recipe(write(tmp_path, TINY), [("base.model.n_layers", 3)])
    assert all(run.config["model"]["n_layers"] == 3 for run in recipe.resolve("mini"))


def test_a_scale_gives_each_row_its_own_train_settings(tmp_path):
    """`scales.X.variants` as a mapping: each row's train settings at that scale, over the size's and the
    variant's; a base.* override still wins; other scales keep theirs; --print-config keeps the runs."""
    sizes = {"a": {"model": {"d_model": 32}, "train": {"lr": 1e-3}}, "b": {"model": {"d_model": 48}}}
    own = {"diff": {"train": {"lr": 7e-3, "warmup_steps": 3}}, "transformer": {"train": {"lr": 5e-3}}}
    path = write(tmp_path, recipe_dict(sizes=sizes, scales__mini__variants=own))
    runs = load_recipe(path, scale="mini").runs
    warmup = load_recipe(path, scale="paper").runs[0].train.warmup_steps  # the default, untouched
    assert warmup != 3
    assert [(r.variant, r.size, r.train.lr, r.train.warmup_steps) for r in runs] == [
        ("diff", "a", 7e-3, 3),  # the mapping's order is the rows' order: diff is the reference here
        ("transformer", "a", 5e-3, warmup),
        ("diff", "b", 7e-3, 3),
        ("transformer", "b", 5e-3, warmup),
    ]
    runs = load_recipe(path, [("base.train.lr", 2e-3)], scale="mini").runs
    assert {r.train.lr for r in runs} == {2e-3}
    assert [(r.size, r.train.lr) for r in load_recipe(path, scale="paper").runs if r.variant == "diff"] == [
        ("a", 1e-3),
        ("b", 1e-3),
    ]
    recipe = load_recipe(path, scale="mini")
    printed = write(tmp_path, yaml.safe_dump(resolved_recipe(recipe), sort_keys=False), "printed.yaml")
    assert [(r.name, r.config) for r in load_recipe(printed, scale="mini").runs] == [
        (r.name, r.config) for r in recipe.runs
    ]


@pytest.mark.parametrize(
    "variants, fragment",
    [
        ({"diff": {"model": {"d_model": 8}}}, "scales.mini.variants: expected a list of strs or a mapping"),
        ({"diff": {"train": {"lrr": 1.0}}}, "train.lrr: unknown key (did you mean 'lr'?)"),
        (
            {"dif": {"train": {"lr": 1.0}}},
            "scales.mini.variants: unknown variant 'dif' (did you mean 'diff'?)",
        ),
    ],
)
def test_a_scales_row_settings_mistakes_are_one_line(tmp_path, variants, fragment):
    with pytest.raises(UserError, match=re.escape(fragment)):
        load_recipe(write(tmp_path, recipe_dict(scales__mini__variants=variants)), scale="mini")


def _tiny_table6_runs(capsys, *overrides: str) -> dict:
    """`ablate check TABLE6 --scale tiny OVERRIDES... --print-config` (exit 0): its runs by name."""
    code, out, err = run_cli(capsys, "check", TABLE6, "--scale", "tiny", *overrides, "--print-config")
    assert code == 0, err
    return printed_runs(out)


def test_base_lr_override_in_exponent_form_applies_to_every_run(capsys):
    """`--base.train.lr 1e-3` (DESIGN.md writes `--base.train.lr 3e-4`) is a number, not the string '1e-3'."""
    runs = _tiny_table6_runs(capsys, "--base.train.lr", "1e-3")
    assert len(runs) == 7
    assert {run["train"]["lr"] for run in runs.values()} == {1e-3}


def test_base_override_through_the_cli_print_config(capsys):
    runs = _tiny_table6_runs(capsys, "--base.train.lr", "0.001", "--base.train.steps=7")
    assert set(runs) == {f"{v}-s0" for v in TABLE6_VARIANTS}
    for run in runs.values():
        assert run["scale"] == "tiny"
        assert run["train"]["lr"] == 0.001
        assert run["train"]["steps"] == 7
        assert run["model"]["d_model"] == 128  # the scale still applies


def test_variant_override_applies_only_to_that_variant(capsys):
    runs = _tiny_table6_runs(capsys, "--variants.diff.model.attention.per_head_norm", "false")
    attention = {name.removesuffix("-s0"): run["model"]["attention"] for name, run in runs.items()}
    assert attention["diff"] == {"name": "diff", "per_head_norm": False, "lambda_init": {"name": "exp_depth"}}
    assert attention["diff_lambda_08"]["per_head_norm"] is True
    assert attention["diff_lambda_05"]["per_head_norm"] is True
    assert attention["transformer_gn"]["per_head_norm"] is True
    assert attention["transformer"] == {"name": "softmax"}


def test_variant_override_is_seen_by_check(capsys):
    code, out, err = run_cli(
        capsys, "check", TABLE6, "--scale", "tiny", "--variants.diff.model.attention.per_head_norm", "false"
    )
    assert code == 0, err
    gn = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) > 4:
            gn[cells[0]] = cells[4]
    assert gn["diff"] == "no"
    assert gn["diff_lambda_08"] == "yes"


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        (["--base.trian.lr", "0.1"], ["base.trian.lr", "'trian' is not a section", "did you mean 'train'?"]),
        (
            ["--variants.dif.model.attention.per_head_norm", "false"],
            [
                "--variants.dif.model.attention.per_head_norm",
                "'variants.dif' is not a section",
                "did you mean 'diff'?",
            ],
        ),
        (
            ["--varaints.diff.label", "X"],
            ["--varaints.diff.label: unknown recipe key 'varaints'", "did you mean 'variants'?"],
        ),
        (["--base.train.lr"], ["--base.train.lr: needs a value"]),
        (["--base.train.lr", "fast"], ["train.lr: expected float", "'fast'"]),
        (["--base.model.d_model", "big"], ["model.d_model: expected an integer from 1 to 65,536", "'big'"]),
        (
            ["--base.model.attention.per_head_nrom", "true"],
            ["per_head_nrom", "did you mean 'per_head_norm'?"],
        ),
    ],
)
def test_bad_overrides_are_one_line(capsys, override, fragments):
    code, out, err = run_cli(capsys, "check", TABLE6, "--scale", "tiny", *override)
    assert_one_line_error(code, err, *fragments)


def test_parse_overrides_forms():
    assert parse_overrides(["--base.train.lr", "0.5", "base.train.steps=3", "--variants.diff.label=D x"]) == [
        ("base.train.lr", 0.5),
        ("base.train.steps", 3),
        ("variants.diff.label", "D x"),
    ]
    assert parse_overrides(["--base.model.attention.per_head_norm", "false"]) == [
        ("base.model.attention.per_head_norm", False)
    ]
    with pytest.raises(UserError, match="not a dotted recipe key"):
        parse_overrides(["--base..lr", "1"])
    with pytest.raises(UserError, match="unexpected argument"):
        parse_overrides(["stray"])


def test_set_dotted_requires_an_existing_parent_and_expands_short_specs():
    tree = {"model": {"attention": "diff"}}
    set_dotted(tree, "model.attention.per_head_norm", False, key="x")
    assert tree == {"model": {"attention": {"name": "diff", "per_head_norm": False}}}
    with pytest.raises(UserError, match="x: 'modle' is not a section of the recipe .did you mean 'model'"):
        set_dotted(tree, "modle.d_model", 1, key="x")


# --- the jsonargparse command line: --help, --print_config, new one-line errors ------------------------


def check_table(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("|")]


@pytest.mark.parametrize("spelling", ["--print_config", "--print-config"])
def test_print_config_round_trips_through_check(tmp_path, capsys, spelling):
    """The printed recipe, saved, gives the same `ablate check` table as the recipe with its overrides."""
    argv = [
        "--scale",
        "tiny",
        "--variants.diff.model.attention.per_head_norm",
        "false",
        "--base.train.steps",
        "7",
    ]
    code, expected, err = run_cli(capsys, "check", TABLE6, *argv)
    assert code == 0, err
    code, printed, err = run_cli(capsys, "check", TABLE6, *argv, spelling)
    assert code == 0, err
    saved = write(tmp_path, printed, "printed.yaml")
    code, out, err = run_cli(capsys, "check", saved)
    assert code == 0, err
    assert check_table(out) == check_table(expected)
    assert {run.config["train"]["steps"] for run in load_recipe(saved).resolve()} == {7}


def test_print_config_round_trips_a_recipe_with_sizes(tmp_path, capsys):
    path = ROOT / "recipes" / "scaling-size.yaml"
    code, expected, err = run_cli(capsys, "check", path, "--scale", "tiny", "--base.train.lr", "0.002")
    assert code == 0, err
    code, printed, err = run_cli(
        capsys, "check", path, "--scale", "tiny", "--base.train.lr", "0.002", "--print_config"
    )
    assert code == 0, err
    saved = write(tmp_path, printed, "printed.yaml")
    original = load_recipe(path, [("base.train.lr", 0.002)]).resolve("tiny")
    assert [(r.name, r.config) for r in load_recipe(saved).resolve()] == [
        (r.name, r.config) for r in original
    ]


def test_check_help_lists_the_train_options_with_types(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(capsys, "check", "--help")
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--allow-unmatched" in out
    lr = out[out.index("--base.train.lr") :]
    assert "peak learning rate" in lr and "float" in lr
    assert "--base.train.precision" in out and "bf16-mixed" in out


@pytest.mark.parametrize("uri", ["ftp://host/mlruns", "htp://localhost:5000"])
def test_tracking_uri_mlflow_cannot_use_is_one_line(tmp_path, capsys, uri):
    code, out, err = run_cli(
        capsys,
        "train",
        write(tmp_path, TINY),
        "--variant",
        "diff",
        "--tracking-uri",
        uri,
        "--workspace",
        tmp_path / "ws",
    )
    assert_one_line_error(code, err, "--tracking-uri", repr(uri), "http://")
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize(
    ("changes", "fragments"),
    [
        ({"name": "../../etc/evil"}, ["name: '../../etc/evil' becomes a file name"]),
        ({"name": "a/b"}, ["name: 'a/b'"]),
        ({"scales": {"../up": {}}}, ["scales.../up: '../up' becomes a file name"]),
        ({"sizes": {"a/b": {}}}, ["sizes.a/b: 'a/b' becomes a file name"]),
        ({"scales": {"mini": {"sizes": {"..": {}}}}}, ["scales.mini.sizes...: '..' becomes a file name"]),
        ({"variants__x/y": {"label": "X"}}, ["variants.x/y: variant keys must be identifiers"]),
    ],
)
def test_recipe_values_that_become_paths_are_refused(tmp_path, capsys, changes, fragments):
    raw = recipe_dict(**{k: v for k, v in changes.items() if "__" in k})
    raw.update({k: v for k, v in changes.items() if "__" not in k})
    code, out, err = run_cli(capsys, "check", write(tmp_path, raw))
    assert_one_line_error(code, err, *fragments)


def test_a_file_name_that_is_no_safe_name_needs_a_name_key(tmp_path, capsys):
    raw = recipe_dict(name=None)
    code, out, err = run_cli(capsys, "check", write(tmp_path, raw, "my recipe.yaml"))
    assert_one_line_error(code, err, "name (taken from the file name 'my recipe.yaml'")
    raw["name"] = "mine"
    code, out, err = run_cli(capsys, "check", write(tmp_path, raw, "my recipe.yaml"))
    assert code == 0, err


@pytest.mark.parametrize(
    ("options", "fragments"),
    [
        (
            {"per_head_norm": "maybe"},
            ["variants.diff", "model.attention.per_head_norm: expected bool", "'maybe'"],
        ),
        ({"lambda_std": "wide"}, ["model.attention.lambda_std: expected float"]),
        (
            {"bogus": 1},
            ["model.attention.bogus", "has no option 'bogus'", "options: n_kv_heads, per_head_norm"],
        ),
        ({"d_model": 64}, ["model.attention.d_model: set by the model"]),
        (
            {"lambda_init": {"name": "constant", "value": "high"}},
            ["model.attention.lambda_init.value: expected float"],
        ),
        ({"lambda_init": {"name": "constnt"}}, ["unknown lambda_init 'constnt'", "did you mean 'constant'?"]),
    ],
)
def test_component_options_are_checked_when_the_recipe_loads(tmp_path, monkeypatch, options, fragments):
    """Against the constructor's signature and type hints, before any model or data is built."""
    import ablate.model.decoder
    from ablate.core import registry

    def never(*args, **kwargs):
        raise AssertionError("a model was built while loading the recipe")

    monkeypatch.setattr(ablate.model.decoder, "build_model", never)
    monkeypatch.setattr(registry, "build", never)
    raw = recipe_dict(variants__diff__model__attention={"name": "diff", **options})
    with pytest.raises(UserError) as info:
        load_recipe(write(tmp_path, raw))
    for fragment in fragments:
        assert fragment in str(info.value)


def test_class_path_options_are_checked_when_the_recipe_loads(tmp_path):
    spec = {"class_path": "components.attention.diff.DiffAttention", "init_args": {"per_head_norm": "maybe"}}
    with pytest.raises(UserError, match="model.attention.per_head_norm: expected bool"):
        load_recipe(write(tmp_path, recipe_dict(variants__diff__model__attention=spec)))


def test_components_help_shows_one_components_options(capsys):
    for argv in (["--kind", "attention", "--help", "diff"], ["--kind", "attention", "--options", "diff"]):
        code, out, err = run_cli(capsys, "components", *argv)
        assert code == 0, err
        rows = {
            line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:4]]
            for line in out.splitlines()[3:]
            if line.startswith("|")
        }
        assert rows["per_head_norm"] == ["bool", "True"]
        assert rows["n_kv_heads"] == ["int or null", "None"]
        assert "d_model" not in rows and "layer_idx" not in rows  # injected structure, not options


def test_recipe_sections_other_issues_add_are_typed(tmp_path):
    raw = recipe_dict(
        eval={"tokens": 1024, "checkpoint": "last"},
        scales__mini__eval={"after_trial": True},
        variants__diff__match="model.head_dim",
    )
    recipe = load_recipe(write(tmp_path, raw))
    assert recipe.eval().checkpoint == "last" and recipe.eval().probes == ["outliers", "quantization"]
    assert recipe.eval("mini").after_trial is True and recipe.eval("mini").tokens == 1024
    for bad, fragment in [
        ({"eval": {"checkpoint": "first"}}, "eval.checkpoint: 'first' is not one of best, last"),
        ({"eval": {"tokens": 0}}, "eval.tokens: expected a positive integer"),
        ({"variants__diff__match": 3}, "variants.diff.match: expected str"),
    ]:
        with pytest.raises(UserError, match=re.escape(fragment)):
            load_recipe(write(tmp_path, recipe_dict(**bad)))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("name: ../../x\n", "name: '../../x' becomes a file name"),
        ("samplr: tpe\n", "samplr: unknown search-spec key (did you mean 'sampler'?)"),
        (
            "sampler: tpe\nspace:\n  base.train.lr: {low: a, high: 1}\n",
            "space.base.train.lr.low: expected float",
        ),
        ("trials_per_variant: 0\n", "trials_per_variant: expected a positive integer"),
        ("compare_with: {path: no/such.csv}\n", "compare_with.path: 'no/such.csv' is not a file"),
        ("compare_with: {label: standard}\n", "compare_with.path"),
    ],
)
def test_search_spec_mistakes_are_one_line(tmp_path, text, fragment):
    from ablate.recipe.search import load_search_spec

    with pytest.raises(UserError, match=re.escape(fragment)):
        load_search_spec(write(tmp_path, text, "spec.yaml"))


def test_rows_sharing_a_label_are_told_apart_by_their_variant_key():
    """Table 6's two "Transformer" rows: their runs (the `ablate.label` tag, tables, legends) carry the key."""
    runs = load_recipe(TABLE6, scale="tiny").runs
    labels = {run.variant: run.label for run in runs}
    assert labels["transformer"] == "Transformer [transformer]"
    assert labels["transformer_d256"] == "Transformer [transformer_d256]"
    assert labels["diff"] == "Diff Transformer"  # a unique label stays as written
    assert len(set(labels.values())) == len(labels)


def test_a_wrong_base_override_names_the_flag_not_a_variant(capsys):
    code, out, err = run_cli(capsys, "check", TABLE6, "--scale", "tiny", "--base.train.lr", "abc")
    assert_one_line_error(code, err, "--base.train.lr: expected float, got 'abc'")
    assert "(in variants" not in err


def test_version_and_whole_verb_summaries(capsys):
    from ablate import __version__
    from ablate.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"ablate {__version__}"
    with pytest.raises(SystemExit):
        main(["--help"])
    listing = " ".join(capsys.readouterr().out.split())
    assert "with budgets, the longest run and a cooldown branch per smaller budget." in listing
