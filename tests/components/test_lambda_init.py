"""λ_init strategies (Eq. 2 text): exp_depth over the 1-based layer index, and constant."""

import math

import pytest

from ablate.core.errors import UserError
from ablate.core.registry import build, entries


@pytest.mark.parametrize("layer", range(1, 25))
def test_exp_depth_formula(layer):
    strategy = build("lambda_init", "exp_depth")
    assert strategy(layer - 1) == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * (layer - 1)), abs=1e-12)


def test_exp_depth_first_layers_and_limit():
    strategy = build("lambda_init", "exp_depth")
    assert strategy(0) == pytest.approx(0.2, abs=1e-12)  # layer 1
    assert strategy(1) == pytest.approx(0.8 - 0.6 * math.exp(-0.3), abs=1e-12)
    values = [strategy(i) for i in range(24)]
    assert values == sorted(values) and values[-1] < 0.8


def test_constant():
    assert build("lambda_init", "constant")(7) == 0.8
    half = build("lambda_init", {"name": "constant", "value": 0.5})
    assert [half(i) for i in (0, 5, 23)] == [0.5, 0.5, 0.5]


def test_registry_entries_and_errors():
    described = {e.name: e.description for e in entries("lambda_init")}
    assert {"exp_depth", "constant"} <= set(described) and all(described.values())
    with pytest.raises(UserError, match=r"value: expected float, got 'high' \(str\)"):
        build("lambda_init", {"name": "constant", "value": "high"}, key="model.attention.lambda_init")
