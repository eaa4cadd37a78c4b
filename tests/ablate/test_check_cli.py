"""`ablate check`: Table 6 is matched, unmatched recipes exit 2, plugins and class paths build by name."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import yaml
from cli_helpers import TABLE6_VARIANTS, assert_one_line_error, run_cli
from torch.utils.flop_counter import FlopCounterMode

from ablate.cli import main
from ablate.model.cost import model_cost
from ablate.model.decoder import build_model
from ablate.recipe.check import CHECK_COLUMNS
from ablate.recipe.loading import load_recipe

HERE = Path(__file__).resolve().parent
TABLE6 = HERE.parents[1] / "recipes" / "table6.yaml"
SI = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


@pytest.fixture
def plugin_path(monkeypatch):
    """Make `plugin_example` (this folder) importable, as an installed plugin package would be."""
    monkeypatch.syspath_prepend(str(HERE))


def check_rows(out: str) -> dict[str, dict[str, str]]:
    """The table `ablate check` prints -> {variant: {column: cell}}, in printed order."""
    lines = [line for line in out.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == list(CHECK_COLUMNS)
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def si_value(text: str) -> float:
    return float(text[:-1]) * SI[text[-1]] if text[-1] in SI else float(text)


def percent(text: str) -> float:
    return float(text.rstrip("%")) / 100


def table6_raw() -> dict:
    return yaml.safe_load(TABLE6.read_text())


def write(tmp_path: Path, raw: dict, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
    return path


def small_recipe(**variants) -> dict:
    """Table 6's tiny scale as a two-or-more-variant recipe of its own (fast to check and to build)."""
    raw = table6_raw()
    base = copy.deepcopy(raw["base"])
    base["model"].update(raw["scales"]["tiny"]["model"])
    base["train"].update(raw["scales"]["tiny"]["train"])
    base["data"] = {"source": "stdlib", "tokenizer": {"name": "byte"}}
    base["model"]["vocab_size"] = 256
    return {
        "name": "plugin_test",
        "base": base,
        "variants": {"transformer": {"label": "Transformer"}, **variants},
    }


# --- Table 6 is matched -----------------------------------------------------------------------------

EXPECTED_SHAPES = {  # Table 6 columns (#heads, d, GN) and the λ_init rule, per scale
    "paper": {
        "transformer": ("16", "128", "no", "-"),
        "transformer_d256": ("8", "256", "no", "-"),
        "transformer_gn": ("8", "256", "yes", "-"),
        "diff": ("8", "128", "yes", "exp_depth"),
        "diff_no_gn": ("8", "128", "no", "exp_depth"),
        "diff_lambda_08": ("8", "128", "yes", "constant 0.8"),
        "diff_lambda_05": ("8", "128", "yes", "constant 0.5"),
    },
    "tiny": {
        "transformer": ("8", "16", "no", "-"),
        "transformer_d256": ("4", "32", "no", "-"),
        "transformer_gn": ("4", "32", "yes", "-"),
        "diff": ("4", "16", "yes", "exp_depth"),
        "diff_no_gn": ("4", "16", "no", "exp_depth"),
        "diff_lambda_08": ("4", "16", "yes", "constant 0.8"),
        "diff_lambda_05": ("4", "16", "yes", "constant 0.5"),
    },
}


@pytest.mark.parametrize("scale", ["paper", "tiny"])
def test_check_table6_prints_seven_matched_variants(capsys, scale):
    argv = ["check", TABLE6] + (["--scale", scale] if scale != "paper" else [])
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert err == ""
    assert f"recipe table6, scale {scale}" in out
    rows = check_rows(out)
    assert list(rows) == TABLE6_VARIANTS
    first = rows["transformer"]
    for variant, row in rows.items():
        params, flops = int(row["params"].replace(",", "")), si_value(row["FLOPs/token (fwd)"])
        assert abs(params / int(first["params"].replace(",", "")) - 1) <= 0.02, variant
        assert abs(flops / si_value(first["FLOPs/token (fwd)"]) - 1) <= 0.02, variant
        assert abs(percent(row["Δparams"])) <= 0.02 and abs(percent(row["ΔFLOPs"])) <= 0.02, variant
        assert row["matched"] == "ok", variant
        assert (row["#heads"], row["d"], row["GN"], row["λ_init"]) == EXPECTED_SHAPES[scale][variant]
    assert "all variants within tolerance (params 2%, FLOPs 2%)" in out.splitlines()[-1]


def test_check_prints_the_budget_module_numbers(capsys):
    code, out, err = run_cli(capsys, "check", TABLE6, "--scale", "tiny")
    assert code == 0, err
    rows = check_rows(out)
    for run in load_recipe(TABLE6).resolve("tiny"):
        budget = model_cost(run.config["model"], run.config["train"]["seq_len"])
        assert rows[run.variant]["params"] == f"{budget.params:,}"
        assert si_value(rows[run.variant]["FLOPs/token (fwd)"]) == pytest.approx(
            budget.fwd_flops_per_token, rel=0.005
        )


# --- unmatched recipes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variant", "model"),
    [
        ("wide_ffn", {"ffn": {"name": "swiglu", "hidden_mult": 4}}),
        ("diff_wide", {"d_model": 256, "attention": {"name": "diff"}}),
    ],
)
def test_unmatched_variant_exits_2_with_one_line(tmp_path, capsys, variant, model):
    raw = table6_raw()
    raw["variants"][variant] = {"label": "Unmatched", "model": model}
    code, out, err = run_cli(capsys, "check", write(tmp_path, raw), "--scale", "tiny")
    assert_one_line_error(
        code, err, f"variants.{variant}:", "tolerance", "params 2%", "flops 2%", "--allow-unmatched"
    )
    for matched in TABLE6_VARIANTS:
        assert f"variants.{matched}:" not in err
    rows = check_rows(out)  # the table is still shown, on stdout
    assert rows[variant]["matched"] == "UNMATCHED"
    assert all(rows[v]["matched"] == "ok" for v in TABLE6_VARIANTS)


def test_allow_unmatched_exits_0_and_says_so(tmp_path, capsys):
    raw = table6_raw()
    raw["variants"]["wide_ffn"] = {"label": "Wide", "model": {"ffn": {"name": "swiglu", "hidden_mult": 4}}}
    code, out, err = run_cli(capsys, "check", write(tmp_path, raw), "--scale", "tiny", "--allow-unmatched")
    assert code == 0, err
    assert check_rows(out)["wide_ffn"]["matched"] == "UNMATCHED"
    assert "unmatched variants allowed by --allow-unmatched" in out


@pytest.mark.parametrize(
    ("tolerance", "matched"),
    [
        ({"params": 0.3, "flops": 0.3}, True),
        ({"params": 0.3, "flops": 0.02}, False),  # FLOPs alone beyond tolerance
        ({"params": 0.02, "flops": 0.3}, False),
    ],  # params alone beyond tolerance
)
def test_each_tolerance_is_checked(tmp_path, capsys, tolerance, matched):
    raw = table6_raw()
    raw["tolerance"] = tolerance
    raw["variants"] = {
        "transformer": raw["variants"]["transformer"],
        "wide_ffn": {"label": "Wide", "model": {"ffn": {"name": "swiglu", "hidden_mult": 4}}},
    }
    raw["scales"] = {"tiny": raw["scales"]["tiny"]}  # other scales list rows this recipe no longer has
    code, out, err = run_cli(capsys, "check", write(tmp_path, raw), "--scale", "tiny")
    rows = check_rows(out)
    assert (
        0.1 < percent(rows["wide_ffn"]["Δparams"]) < 0.3 and 0.1 < percent(rows["wide_ffn"]["ΔFLOPs"]) < 0.3
    )
    if matched:
        assert code == 0, err
    else:
        assert_one_line_error(code, err, "variants.wide_ffn:")


# --- plugins and class paths ------------------------------------------------------------------------


def test_plugin_from_imports_is_built_by_name(tmp_path, capsys, plugin_path):
    raw = small_recipe(
        local={"label": "Local", "model": {"attention": {"name": "test_local_attention", "window": 4}}}
    )
    raw["imports"] = ["plugin_example"]
    path = write(tmp_path, raw)
    code, out, err = run_cli(capsys, "check", path)
    assert code == 0, err
    rows = check_rows(out)
    assert list(rows) == ["transformer", "local"]
    assert (rows["local"]["#heads"], rows["local"]["d"], rows["local"]["matched"]) == ("8", "16", "ok")

    from plugin_example import LocalAttention

    (run,) = load_recipe(path).resolve(variants=["local"])
    model = build_model({**run.config["model"], "attention_backend": "math"}, seed=0)
    assert all(type(b.attention) is LocalAttention and b.attention.window == 4 for b in model.blocks)
    assert model.blocks[0].attention.out_proj.weight.abs().sum() == 0  # its residual_out was honoured
    x = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        logits = model(x)
    assert logits.shape == (1, 32, 256)
    budget = model_cost(run.config["model"], 32)
    assert budget.params == sum(p.numel() for p in model.parameters())
    assert budget.fwd_flops_per_token == pytest.approx(counter.get_total_flops() / 32, rel=0.01)


def test_plugin_option_types_are_checked(tmp_path, capsys, plugin_path):
    raw = small_recipe(
        local={"label": "Local", "model": {"attention": {"name": "test_local_attention", "window": "four"}}}
    )
    raw["imports"] = ["plugin_example"]
    code, out, err = run_cli(capsys, "check", write(tmp_path, raw))
    assert_one_line_error(code, err, "model.attention.window: expected int")


def test_misspelt_plugin_name_suggests_it(tmp_path, capsys, plugin_path):
    raw = small_recipe(local={"label": "Local", "model": {"attention": {"name": "test_local_atention"}}})
    raw["imports"] = ["plugin_example"]
    code, out, err = run_cli(capsys, "check", write(tmp_path, raw))
    assert_one_line_error(code, err, "did you mean 'test_local_attention'?")


def test_class_path_and_init_args(tmp_path, capsys, plugin_path):
    spec = {"class_path": "plugin_example.LocalAttention", "init_args": {"window": 3}}
    raw = small_recipe(local={"label": "Local", "model": {"attention": spec}})
    path = write(tmp_path, raw)
    code, out, err = run_cli(capsys, "check", path)
    assert code == 0, err
    assert check_rows(out)["local"]["matched"] == "ok"
    (run,) = load_recipe(path).resolve(variants=["local"])
    assert run.config["model"]["attention"] == spec  # not merged with the base's {name: softmax}
    model = build_model(run.config["model"], seed=0)
    assert [b.attention.window for b in model.blocks] == [3, 3, 3, 3]
    assert type(model.blocks[0].attention).__qualname__ == "LocalAttention"


def test_class_path_with_a_bad_init_arg(tmp_path, capsys, plugin_path):
    spec = {"class_path": "plugin_example.LocalAttention", "init_args": {"widnow": 3}}
    code, out, err = run_cli(
        capsys, "check", write(tmp_path, small_recipe(local={"label": "L", "model": {"attention": spec}}))
    )
    assert_one_line_error(code, err, "model.attention.widnow", "did you mean 'window'?")


def test_unknown_attention_name_exits_2_with_did_you_mean(tmp_path, capsys):
    raw = small_recipe(diff={"label": "Diff", "model": {"attention": {"name": "dif"}}})
    code, out, err = run_cli(capsys, "check", write(tmp_path, raw))
    assert_one_line_error(
        code,
        err,
        "model.attention.name: unknown attention 'dif'",
        "(did you mean 'diff'?)",
        "known:",
        "softmax",
    )


def test_readme_add_a_component_example_builds_from_a_recipe(tmp_path, monkeypatch, capsys):
    """The docs' "Add a component" example is real code: extract it, register it through `imports:`, build and check."""
    import re
    from pathlib import Path

    import torch

    from ablate.model.decoder import build_model
    from ablate.recipe.loading import load_recipe

    page = (Path(__file__).resolve().parents[2] / "docs" / "recipes-and-components.md").read_text()
    section = page.split("### Add a component", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len([line for line in code.splitlines() if line.strip()]) <= 20  # "an example of 20 lines"
    (tmp_path / "my_attention.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    recipe = tmp_path / "v2.yaml"
    recipe.write_text(
        "imports: [my_attention]\n"
        "base:\n  model: {vocab_size: 64, d_model: 32, n_layers: 2, head_dim: 8, attention: softmax}\n"
        "  train: {seq_len: 16, batch_tokens: 64, micro_batch_size: 4, steps: 1, lr: 1.0e-3}\n"
        "  data: {source: stdlib}\n"
        "variants:\n  gated: {label: Gated, model: {attention: {name: gated}}}\n"
    )
    (run,) = load_recipe(recipe).resolve()
    model = build_model(run.config["model"], seed=0)
    assert type(model.blocks[0].attention).__name__ == "GatedAttention"
    assert model(torch.randint(0, 64, (2, 16))).shape == (2, 16, 64)
    assert main(["components", "--kind", "attention", "--imports", "my_attention"]) == 0
    assert "gated" in capsys.readouterr().out


def test_flags_are_never_abbreviated(capsys):
    """`--h` is not `--help` nor `--scal` `--scale`: a prefix is read as a recipe override and refused."""
    code, out, err = run_cli(capsys, "check", TABLE6, "--h", "1e-3")
    assert_one_line_error(code, err, "--h", "unknown recipe key 'h'")
    assert "usage" not in out
    code, _, err = run_cli(capsys, "check", TABLE6, "--scal", "tiny")
    assert_one_line_error(code, err, "--scal", "did you mean 'scales'")


def test_bench_flags_follow_run_benchs_keyword_arguments(monkeypatch):
    """A keyword argument added to `run_bench` (here `device`, `precision`) is an `ablate bench` flag."""
    import ablate.verbs.bench
    from ablate.cli import parse_args

    def run_bench(
        recipe_path,
        scale="small",
        *,
        overrides=(),
        compile=False,
        device: str = "cpu",
        precision: str | None = None,
        echo: bool = True,
    ):
        """Stand-in with run_bench's shape plus two new options."""

    monkeypatch.setattr(ablate.verbs.bench, "run_bench", run_bench)
    verb, values, overrides, _ = parse_args(
        ["bench", str(TABLE6), "--device", "cuda", "--precision=bf16", "--base.train.lr", "0.1"]
    )
    assert (verb, values["device"], values["precision"], overrides) == (
        "bench",
        "cuda",
        "bf16",
        [("base.train.lr", 0.1)],
    )
    assert "echo" not in values  # the library's own arguments stay off the command line
    _, values, _, _ = parse_args(["bench"])
    assert (values["device"], values["precision"], values["recipe"]) == ("cpu", None, "recipes/table6.yaml")


def test_a_warmup_as_long_as_the_run_is_noted_once(capsys):
    code, out, err = run_cli(capsys, "check", TABLE6, "--scale", "tiny", "--base.train.steps", "5")
    assert code == 0, err
    notes = [line for line in out.splitlines() if "warmup_steps" in line]
    assert notes == [
        "train.warmup_steps 10 >= train.steps 5: the learning rate rises for the whole run and never "
        "reaches train.lr 0.003 (lower train.warmup_steps too)"
    ]
    code, out, err = run_cli(capsys, "check", TABLE6, "--scale", "tiny")
    assert code == 0 and "warmup_steps" not in out
