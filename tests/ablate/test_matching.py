"""`match:`: the resolver solves a variant's knob so its parameters (or FLOPs) equal the first row's."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from cli_helpers import assert_one_line_error, run_cli

from ablate.core.errors import UserError
from ablate.model.cost import model_cost
from ablate.model.decoder import build_model
from ablate.recipe.loading import load_recipe

ROOT = Path(__file__).resolve().parents[2]
DIFF_V2 = ROOT / "recipes" / "diff-v2.yaml"
TABLE6 = ROOT / "recipes" / "table6.yaml"


def swiglu_params(vocab: int, d: int, layers: int, hidden: int, attention: int) -> int:
    """Untied decoder with SwiGLU, written from its parts: embedding and head, per layer attention + FFN
    + two norms, final norm."""
    return 2 * vocab * d + layers * (attention + 3 * d * hidden + 2 * d) + d


def tiny_recipe(tmp_path: Path, **variants) -> Path:
    """Table 6's tiny scale as a recipe of its own, the Transformer first, then `variants`."""
    raw = yaml.safe_load(TABLE6.read_text())
    base = copy.deepcopy(raw["base"])
    for section in ("model", "train"):
        base[section].update(raw["scales"]["tiny"][section])
    base["data"] = {"source": "stdlib", "tokenizer": {"name": "byte"}}
    base["model"]["vocab_size"] = 256
    recipe = {"name": "match_test", "base": base, "variants": {"transformer": {"label": "T"}, **variants}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True))
    return path


@pytest.mark.parametrize("scale", ["tiny", "small", "paper"])
def test_diff_v2_recipe_is_matched_at_every_scale_and_prints_the_solved_width(capsys, scale):
    code, out, err = run_cli(capsys, "check", DIFF_V2, "--scale", scale)
    assert code == 0, err
    assert "all variants within tolerance (params 2%, FLOPs 2%)" in out.splitlines()[-1]
    runs = {run.variant: run for run in load_recipe(DIFF_V2).resolve(scale)}
    assert list(runs) == ["transformer", "diff", "diff_v2"]
    solved = runs["diff_v2"].config["model"]["ffn"]["hidden_mult"]
    assert f"variants.diff_v2: solved model.ffn.hidden_mult = {solved:g} to match params" in out
    # the solved width, counted by hand: V2's attention (h = d_model / 2d output heads) and the FFN it gives
    model = runs["diff_v2"].config["model"]
    d_model, d, vocab, layers = model["d_model"], model["head_dim"], model["vocab_size"], model["n_layers"]
    h = d_model // (2 * d)
    attention = d_model * 2 * h * d + 2 * d_model * h * d + h * d * d_model + d_model * h
    hidden = build_model(model, device="meta").blocks[0].ffn.hidden
    assert model_cost(model, 64).params == swiglu_params(vocab, d_model, layers, hidden, attention)
    target = swiglu_params(vocab, d_model, layers, round(8 / 3 * d_model), 4 * d_model * d_model)
    assert model_cost(runs["transformer"].config["model"], 64).params == target
    # the nearest whole hidden width: one unit more or less would be further from the Transformer
    assert all(
        abs(swiglu_params(vocab, d_model, layers, hidden, attention) - target)
        <= abs(swiglu_params(vocab, d_model, layers, other, attention) - target)
        for other in (hidden - 1, hidden + 1)
    )


def test_the_solved_value_is_what_training_builds(tmp_path):
    path = tiny_recipe(
        tmp_path,
        v2={
            "label": "V2",
            "model": {"attention": {"name": "diff_v2", "heads_mult": 0.5}},
            "match": "model.ffn.hidden_mult",
        },
    )
    runs = {run.variant: run for run in load_recipe(path).resolve(seeds=[0, 1])}
    assert {runs[k].config["model"]["ffn"]["hidden_mult"] for k in runs if k.startswith("v2")} == {
        runs["v2"].config["model"]["ffn"]["hidden_mult"]
    }
    solved = runs["v2"].config["model"]["ffn"]
    assert solved["name"] == "swiglu" and solved["hidden_mult"] != pytest.approx(8 / 3)
    model = build_model(runs["v2"].config["model"], seed=0)
    assert model.blocks[0].ffn.hidden == round(solved["hidden_mult"] * 128)
    params = sum(p.numel() for p in model.parameters())
    reference = sum(p.numel() for p in build_model(runs["transformer"].config["model"], seed=0).parameters())
    assert abs(params / reference - 1) < 0.02 / 100 + 1e-3  # solved well inside the 2% tolerance


def test_match_on_flops(tmp_path, capsys):
    """A GELU MLP (two matrices) solved for the SwiGLU Transformer's forward FLOPs."""
    path = tiny_recipe(
        tmp_path,
        gelu={
            "label": "GELU",
            "model": {"ffn": {"name": "gelu"}},
            "match": "model.ffn.hidden_mult",
            "match_on": "flops",
        },
    )
    code, out, err = run_cli(capsys, "check", path)
    assert code == 0, err
    runs = {run.variant: run for run in load_recipe(path).resolve()}
    budgets = {k: model_cost(r.config["model"], r.config["train"]["seq_len"]) for k, r in runs.items()}
    hidden = build_model(runs["gelu"].config["model"], device="meta").blocks[0].ffn.hidden
    assert abs(hidden - 1.5 * round(8 / 3 * 128)) <= 1  # 2 matrices instead of 3: 1.5 x the width
    assert budgets["gelu"].fwd_flops_per_token == pytest.approx(
        budgets["transformer"].fwd_flops_per_token, rel=2e-3
    )
    assert (
        "variants.gelu: solved model.ffn.hidden_mult" in out
        and "to match flops of variants.transformer" in out
    )


def test_an_integer_knob_is_solved_in_whole_numbers(tmp_path):
    """Half the FFN width, the depth solved: 4 layers of the Transformer's params need 6 of the thinner."""
    path = tiny_recipe(
        tmp_path,
        thin={
            "label": "Thin",
            "model": {"ffn": {"name": "swiglu", "hidden_mult": 4 / 3}},
            "match": "model.n_layers",
        },
    )
    runs = {run.variant: run for run in load_recipe(path).resolve()}
    assert runs["thin"].config["model"]["n_layers"] == 6


def test_a_knob_that_cannot_match_is_one_line(tmp_path, capsys):
    path_text = tiny_recipe(
        tmp_path,
        wide={
            "label": "Wide",
            "model": {"ffn": {"name": "swiglu", "hidden_mult": 4}},
            "match": "model.norm.eps",
        },
    )
    code, out, err = run_cli(capsys, "check", path_text)
    assert_one_line_error(
        code,
        err,
        "variants.wide.match: no value of model.norm.eps brings params within 2% of variants.transformer's",
        "closest:",
    )


@pytest.mark.parametrize(
    ("variant", "message"),
    [
        ({"match": "ffn.hidden_mult"}, "variants.bad.match: expected a numeric model knob"),
        (
            {"match": "model.ffn.hidden_mult", "match_on": "time"},
            "variants.bad.match_on: 'time' is not one of params, flops",
        ),
        ({"match": "model.ffn.widht"}, "variants.bad.match: model.ffn.widht: swiglu has no option 'widht'"),
        ({"match": "model.position.style"}, "variants.bad.match: model.position.style must be a number"),
        ({"match": "model.tie_embeddings"}, "variants.bad.match: model.tie_embeddings must be a number"),
    ],
)
def test_bad_match_requests_are_user_errors(tmp_path, capsys, variant, message):
    path = tiny_recipe(tmp_path, bad={"label": "Bad", **variant})
    code, out, err = run_cli(capsys, "check", path)
    assert_one_line_error(code, err, message)


def test_the_first_variant_cannot_match_itself(tmp_path):
    raw = yaml.safe_load(tiny_recipe(tmp_path).read_text())
    raw["variants"]["transformer"]["match"] = "model.ffn.hidden_mult"
    raw["variants"]["other"] = {"label": "O"}
    (tmp_path / "first.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(UserError, match="variants.transformer.match: the first variant is the reference"):
        load_recipe(tmp_path / "first.yaml")
