"""Every size knob is an integer with a bound, checked before anything is built: `check`, `sweep --no-train`
and `train` on a depth, width, head count, vocabulary, sequence length or batch of 10^5, 10^9, 1e9 or
4.1e116 end in one line and exit 2, or (in bounds) finish. `check` once never ended on `n_layers: 100000`
(the model was built one module per layer to be counted) and took `n_layers: 1e9` as a layer count."""

from __future__ import annotations

import copy

import pytest
import yaml
from cli_helpers import assert_one_line_error, run_cli

from ablate.core.registry import load_plugins
from ablate.model.config import MAX_LAYERS
from ablate.model.cost import model_cost
from ablate.model.decoder import build_model

RECIPE = {
    "name": "bounds",
    "base": {
        "model": {
            "vocab_size": 260,
            "d_model": 16,
            "n_layers": 2,
            "head_dim": 8,
            "attention_backend": "math",
        },
        "train": {
            "seq_len": 16,
            "batch_tokens": 64,
            "micro_batch_size": 4,
            "steps": 1,
            "lr": 1e-3,
            "warmup_steps": 0,
            "val_every": 1,
            "val_batches": 1,
            "precision": "32-true",
            "accelerator": "cpu",
        },
        "data": {"source": "stdlib"},
    },
    "variants": {"transformer": {"label": "Transformer", "model": {"attention": {"name": "softmax"}}}},
}

KNOBS = {  # the knob: where it is written, and the key its error names
    "n_layers": (("base", "model", "n_layers"), "model.n_layers"),
    "d_model": (("base", "model", "d_model"), "model.d_model"),
    "head_dim": (("base", "model", "head_dim"), "model.head_dim"),
    "heads": (("variants", "transformer", "model", "attention", "n_kv_heads"), "n_kv_heads"),
    "vocab_size": (("base", "model", "vocab_size"), "model.vocab_size"),
    "seq_len": (
        ("base", "train", "seq_len"),
        "train.",
    ),  # in bounds at 10^5: then batch_tokens is no multiple
    "batch_tokens": (("base", "train", "batch_tokens"), "train.batch_tokens"),
    "micro_batch_size": (("base", "train", "micro_batch_size"), "train."),
}
VALUES = {"1e5": 10**5, "1e9-int": 10**9, "1e9-float": 1e9, "4.1e116": 4.1e116}
IN_BOUNDS = {("vocab_size", "1e5")}  # a vocabulary of 100K trains; every other case is refused


def _recipe(tmp_path, knob: str, value: object):
    document = copy.deepcopy(RECIPE)
    path, _ = KNOBS[knob]
    node = document
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    out = tmp_path / "bounds.yaml"
    out.write_text(yaml.safe_dump(document))
    return out


VERBS = {
    "check": lambda recipe, ws: ["check", recipe],
    "sweep": lambda recipe, ws: ["sweep", recipe, "--no-train", "--workspace", ws],
    "train": lambda recipe, ws: ["train", recipe, "--variant", "transformer", "--workspace", ws],
}


@pytest.mark.parametrize("label", list(VALUES))
@pytest.mark.parametrize("knob", list(KNOBS))
def test_each_verb_refuses_a_size_past_its_bound_in_one_line(tmp_path, capsys, knob, label):
    recipe = _recipe(tmp_path, knob, VALUES[label])
    for verb, argv in VERBS.items():
        if (knob, label) in IN_BOUNDS and verb != "check":
            continue  # trained below, once
        code, _, err = run_cli(capsys, *argv(recipe, tmp_path / "ws"))
        if (knob, label) in IN_BOUNDS:
            assert code == 0, err
        else:
            assert_one_line_error(code, err, KNOBS[knob][1])
    if (knob, label) not in IN_BOUNDS:
        assert not (tmp_path / "ws").exists(), list(
            (tmp_path / "ws").rglob("*")
        )  # refused before anything was made


def test_a_large_vocabulary_in_bounds_trains(tmp_path, capsys):
    code, _, err = run_cli(capsys, *VERBS["train"](_recipe(tmp_path, "vocab_size", 10**5), tmp_path / "ws"))
    assert code == 0, err


def test_the_bound_names_what_is_allowed(tmp_path, capsys):
    code, _, err = run_cli(capsys, "check", _recipe(tmp_path, "n_layers", 3.0))
    assert_one_line_error(code, err, "model.n_layers: expected an integer from 1 to 1,024, got 3.0 (float)")
    code, _, err = run_cli(capsys, "check", _recipe(tmp_path, "n_layers", 10**200))
    assert_one_line_error(code, err, "got an integer of about 10^200")


@pytest.mark.parametrize(
    "attention",
    ["softmax", {"name": "diff"}, {"name": "diff_v2"}, {"name": "softmax", "per_head_norm": True}],
)
@pytest.mark.parametrize("tie", [False, True])
def test_the_cost_of_one_block_times_the_depth_is_the_whole_models(attention, tie):
    """Counted independently: every parameter of the whole model built on meta, and its own flops()."""
    load_plugins()
    config = {"vocab_size": 97, "d_model": 32, "n_layers": 5, "head_dim": 8, "attention": attention}
    config["tie_embeddings"] = tie
    whole = build_model(config, device="meta")
    cost = model_cost(config, seq_len=24)
    assert cost.params == sum(p.numel() for p in whole.parameters())
    assert cost.fwd_flops_per_token * 24 == whole.flops(24)


def test_the_deepest_model_allowed_is_counted_without_building_its_layers(monkeypatch):
    """At the bound's depth the cost builds two blocks, not one per layer."""
    from ablate.model import decoder

    built = []
    real = decoder.Block.__init__

    def counting(self, config, layer_idx, *args, **kwargs):
        built.append(layer_idx)
        real(self, config, layer_idx, *args, **kwargs)

    monkeypatch.setattr(decoder.Block, "__init__", counting)
    load_plugins()
    cost = model_cost({"vocab_size": 97, "d_model": 32, "n_layers": MAX_LAYERS, "head_dim": 8}, seq_len=16)
    assert sorted(built) == [0, MAX_LAYERS - 1] and cost.params > MAX_LAYERS * 32 * 32
