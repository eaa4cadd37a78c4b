"""The coordinate check: what it measures (against a float64 recomputation), and how its report calls a
curve flat or not (slopes against a least-squares fit written here)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ablate.core.registry import load_plugins
from ablate.model.decoder import build_model
from ablate.report.coord import Curve, curves, read_rows, write
from ablate.train.coord import activations, as_dicts, coord_check, width_config

BASE = {
    "vocab_size": 64,
    "d_model": 32,
    "n_layers": 2,
    "head_dim": 8,
    "attention": {"name": "softmax"},
    "attention_backend": "math",
}


@pytest.fixture(autouse=True, scope="module")
def _plugins():
    load_plugins()


def test_width_config_scales_the_head_and_names_the_base():
    config = width_config(BASE, 128, "mup")
    assert (config["d_model"], config["head_dim"], config["n_layers"]) == (128, 32, 2)
    assert config["parametrization"] == {
        "name": "mup",
        "base_d_model": 32,
        "base_head_dim": 8,
        "base_n_layers": 2,
    }
    assert width_config(BASE, 64, "standard")["parametrization"] == "standard"


def test_step_zero_is_the_models_own_output_and_change_is_measured_from_it():
    tokens = torch.randint(0, 64, (4000,), generator=torch.Generator().manual_seed(0))
    rows = as_dicts(
        coord_check(
            {"t": BASE}, tokens, widths=[32, 64], steps=2, seeds=[3], batch_size=2, seq_len=8, lr=1e-2
        )
    )
    layers = {"embed", "logits"} | {
        f"layer_{i:02d}.{p}" for i in range(2) for p in ("attention", "ffn", "residual")
    }
    for par in ("standard", "mup"):
        for width in (32, 64):
            mine = [r for r in rows if r["parametrization"] == par and r["width"] == width]
            assert {r["layer"] for r in mine if r["step"] == 0} == layers
            assert {(r["step"], r["kind"]) for r in mine} == {(0, "activation")} | {
                (s, k) for s in (1, 2) for k in ("activation", "change")
            }
    # step 0's logits RMS: the freshly built model on the probe batch (the first window of seed 3's draw)
    gen = torch.Generator().manual_seed(3)
    starts = torch.randint(0, len(tokens) - 9, (3, 2), generator=gen)
    probe = torch.stack([tokens[s : s + 8] for s in starts[0].tolist()])
    model = build_model(width_config(BASE, 64, "mup"), seed=3)
    logits = model(probe).detach().double()
    want = math.sqrt(float((logits**2).mean()))
    got = next(
        r["rms"]
        for r in rows
        if (r["parametrization"], r["width"], r["step"], r["layer"]) == ("mup", 64, 0, "logits")
    )
    assert got == pytest.approx(want, rel=1e-12)
    assert set(activations(model, probe)) == layers


def test_slopes_flat_and_not_flat(tmp_path):
    widths = [32, 64, 128, 256]
    rows = []
    for layer, power in (("flat", 0.0), ("grows", 1.0), ("barely", 0.2)):
        for seed, noise in ((0, 1.02), (1, 0.98)):
            for w in widths:
                rows.append(
                    {"variant": "v", "parametrization": "p", "width": w, "seed": seed, "step": 5,
                     "layer": layer, "kind": "change", "rms": noise * 0.1 * w**power}
                )  # fmt: skip
    found = {c.layer: c for c in curves(rows)}
    x = np.log2(widths)
    for layer, power in (("flat", 0.0), ("grows", 1.0), ("barely", 0.2)):
        y = np.log2([0.1 * w**power for w in widths])  # the seed mean
        assert found[layer].slope == pytest.approx(np.polyfit(x, y, 1)[0], abs=1e-9)
    assert [found[k].flat for k in ("flat", "grows", "barely")] == [True, False, True]
    text = write(rows, tmp_path)
    assert "| v | p | change | 2/3 | grows +1.00 | grows (+1.00) |" in text
    assert {p.name for p in tmp_path.iterdir()} == {"coord.csv", "slopes.csv", "coord.png", "report.md"}
    assert read_rows(tmp_path / "coord.csv") == rows  # the folder regenerates from its CSV


def test_a_curve_of_one_width_has_slope_zero():
    assert Curve("v", "p", "l", "change", (64,), (0.3,)).slope == 0.0
