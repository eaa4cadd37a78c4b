"""What the built-in components tell the engine through `ablate.core.contract`: their columns, their λ rule, and
FLOPs of element-wise components (zero, by the convention)."""

from __future__ import annotations

import math

import pytest
import torch

from ablate.core import contract
from ablate.core.registry import build

STRUCTURE = {
    "d_model": 96,
    "head_dim": 8,
    "layer_idx": 2,
    "n_layers": 4,
    "position": "rope",
    "backend": "math",
}


@pytest.mark.parametrize(
    ("spec", "columns"),
    [
        ({"name": "softmax"}, {"heads": "12", "d": "8", "gn": "no", "lambda_init": "-"}),
        (
            {"name": "softmax", "head_dim_mult": 2, "per_head_norm": True},
            {"heads": "6", "d": "16", "gn": "yes", "lambda_init": "-"},
        ),
        ({"name": "diff"}, {"heads": "6", "d": "8", "gn": "yes", "lambda_init": "exp_depth"}),
        (
            {"name": "diff", "per_head_norm": False, "lambda_init": {"name": "constant", "value": 0.5}},
            {"heads": "6", "d": "8", "gn": "no", "lambda_init": "constant 0.5"},
        ),
        (
            {"name": "diff_v2", "heads_mult": 0.5},
            {"heads": "6 (12 q)", "d": "8", "gn": "no", "lambda_init": "sigmoid(λ_proj x)"},
        ),
    ],
)
def test_attention_columns(spec, columns):
    with torch.device("meta"):
        module = build("attention", spec, key="model.attention", **STRUCTURE)
    assert contract.attention_columns(module) == columns


def test_lambda_rules_describe_themselves():
    exp_depth = build("lambda_init", "exp_depth", key="lambda_init")
    constant = build("lambda_init", {"name": "constant", "value": 0.8}, key="lambda_init")
    assert (exp_depth.describe(), constant.describe()) == ("exp_depth", "constant 0.8")
    assert exp_depth(2) == pytest.approx(0.8 - 0.6 * math.exp(-0.6))


@pytest.mark.parametrize("name", ["rmsnorm", "layernorm"])
def test_norms_report_zero_flops_and_are_counted_so(name):
    norm = build("norm", name, key="model.norm", dim=32)
    assert norm.flops(64) == 0 == contract.counted_flops(norm, 64, 32)


def test_lambda_value_is_logged_only_where_a_component_has_one():
    diff = build("attention", "diff", key="model.attention", **STRUCTURE)
    softmax = build("attention", "softmax", key="model.attention", **STRUCTURE)
    with torch.no_grad():  # Eq. 2
        lam = (
            (diff.lambda_q1 @ diff.lambda_k1).exp()
            - (diff.lambda_q2 @ diff.lambda_k2).exp()
            + diff.lambda_init
        )
    assert contract.lambda_value(diff) == pytest.approx(lam.item(), rel=1e-6)
    assert contract.lambda_value(softmax) is None
