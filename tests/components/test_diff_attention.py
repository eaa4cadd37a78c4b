"""Differential attention against an independent float64 implementation of Eq. 1-3 (conftest.diff_ref)."""

from __future__ import annotations

import math

import pytest
import torch
from attention_setup import build_attention, reference_diff_shapes, run_fp32

from ablate.core.errors import UserError
from ablate.core.registry import build

D_MODEL, HEAD_DIM, LAYER = 96, 8, 3  # h = 6 diff heads of width 8 (V width 16)
BATCH, SEQ = 2, 9
LAMBDA_INITS = {"exp_depth": 0.8 - 0.6 * math.exp(-0.3 * LAYER), "constant": 0.5}


def make(
    *, backend="math", n_kv_heads=None, per_head_norm=True, lambda_init="exp_depth", position="rope", seed=0
):
    spec = {"name": "diff", "n_kv_heads": n_kv_heads, "per_head_norm": per_head_norm}
    spec["lambda_init"] = {"name": "constant", "value": 0.5} if lambda_init == "constant" else lambda_init
    module = build_attention(
        spec, D_MODEL, HEAD_DIM, layer_idx=LAYER, n_layers=8, position=position, backend=backend, seed=seed
    )
    with torch.no_grad():  # make every parameter matter: λ far from λ_init, norm weight not ones
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            getattr(module, name).normal_(0.0, 0.3)
        if module.subln is not None:
            module.subln.weight.normal_(1.0, 0.2)
    return module


def run_both(module, reference, *, h_kv, lam_init, norm, rope):
    """Output and gradients (input and every parameter) of the module in fp32 and of diff_ref in fp64."""
    torch.manual_seed(1)
    x = torch.randn(BATCH, SEQ, D_MODEL)
    g = torch.randn(BATCH, SEQ, D_MODEL)
    out, x32, x64, params = run_fp32(module, x, g)
    ref = reference.diff(
        x64, params, h=D_MODEL // (2 * HEAD_DIM), h_kv=h_kv, lam_init=lam_init, norm=norm, rope=rope
    )
    (ref * g.double()).sum().backward()
    pairs = {"output": (out, ref), "grad x": (x32.grad, x64.grad)}
    pairs.update({f"grad {n}": (t.grad, params[n].grad) for n, t in module.named_parameters()})
    return pairs


@pytest.mark.parametrize("position", ["rope", "none"])
@pytest.mark.parametrize("lambda_init", ["exp_depth", "constant"])
@pytest.mark.parametrize("per_head_norm", [True, False], ids=["norm", "no-norm"])
@pytest.mark.parametrize(
    "backend", ["math", "sdpa", "sdpa_padded", "blockwise", "blocks", "combined", "flash_attn", "auto"]
)
@pytest.mark.parametrize("n_kv_heads", [None, 2], ids=["mha", "gqa"])
def test_matches_equations(reference, fake_flash, n_kv_heads, backend, per_head_norm, lambda_init, position):
    module = make(
        backend=backend,
        n_kv_heads=n_kv_heads,
        per_head_norm=per_head_norm,
        lambda_init=lambda_init,
        position=position,
    )
    h_kv = n_kv_heads or D_MODEL // (2 * HEAD_DIM)
    pairs = run_both(
        module,
        reference,
        h_kv=h_kv,
        lam_init=LAMBDA_INITS[lambda_init],
        norm=per_head_norm,
        rope="interleaved" if position == "rope" else None,
    )
    assert len(pairs) == 2 + 4 + 4 + per_head_norm  # x, 4 projections, 4 λ vectors, subln
    for what, (actual, expected) in pairs.items():
        assert reference.rel_err(actual, expected) < 1e-5, what
    # The stand-in kernel ran exactly when asked for (auto on CPU is sdpa), and only with equal widths.
    assert bool(fake_flash) == (backend == "flash_attn")
    for call in fake_flash:
        assert call["causal"] and call["dropout_p"] == 0.0
        assert call["q"][2] == 2 * D_MODEL // (2 * HEAD_DIM) and call["k"][2] == 2 * h_kv  # GQA kept native


def test_rotate_half_rope(reference):
    module = make(position={"name": "rope", "style": "rotate_half"}, n_kv_heads=3)
    for what, (actual, expected) in run_both(
        module, reference, h_kv=3, lam_init=LAMBDA_INITS["exp_depth"], norm=True, rope="rotate_half"
    ).items():
        assert reference.rel_err(actual, expected) < 1e-5, what


def test_return_weights_are_causal_distributions():
    module = make(backend="math", n_kv_heads=2)
    x = torch.randn(BATCH, SEQ, D_MODEL)
    out, weights = module(x, return_weights=True)
    assert set(weights) == {"a1", "a2", "lambda"}
    assert torch.equal(weights["lambda"], module.lambda_value())
    upper = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)
    for name in ("a1", "a2"):
        a = weights[name]
        assert a.shape == (BATCH, D_MODEL // (2 * HEAD_DIM), SEQ, SEQ)
        torch.testing.assert_close(a.sum(-1), torch.ones(a.shape[:-1]))
        assert (a[..., upper] == 0).all() and (a[..., ~upper] > 0).all()
    torch.testing.assert_close(out, module(x))
    # Other backends return the same maps (computed by the math form) and the same output.
    module.backend = "sdpa"
    out_sdpa, weights_sdpa = module(x, return_weights=True)
    torch.testing.assert_close(out_sdpa, out)
    torch.testing.assert_close(weights_sdpa["a1"], weights["a1"])


def test_lambda_value_and_init_std():
    module = build(
        "attention",
        {"name": "diff", "lambda_std": 0.02},
        d_model=D_MODEL,
        head_dim=HEAD_DIM,
        layer_idx=5,
        n_layers=8,
    )
    assert module.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * 5))
    assert module.init_std == {"lambda_q1": 0.02, "lambda_k1": 0.02, "lambda_q2": 0.02, "lambda_k2": 0.02}
    for name in module.init_std:
        assert getattr(module, name).dtype == torch.float32 and getattr(module, name).shape == (HEAD_DIM,)
    with torch.no_grad():
        for name in module.init_std:
            getattr(module, name).zero_()
    lam = module.lambda_value()
    assert lam.dtype == torch.float32 and lam.dim() == 0
    assert lam.item() == pytest.approx(module.lambda_init)  # exp(0) - exp(0) + λ_init
    assert module.residual_out == ("out_proj.weight",)
    assert module.subln.weight.shape == (2 * HEAD_DIM,) and torch.equal(module.subln.weight, torch.ones(16))


def test_parameter_layout_is_the_references():
    module = make(n_kv_heads=2)
    shapes = {n: tuple(t.shape) for n, t in module.state_dict().items()}
    assert shapes == reference_diff_shapes(D_MODEL, 2 * 2 * HEAD_DIM, HEAD_DIM)  # 2 kv heads of 2 sub-heads


@pytest.mark.parametrize(
    ("spec", "structure", "message"),
    [
        ({"name": "diff", "n_kv_heads": 4}, {}, "model.attention.n_kv_heads: 4 does not divide 6 diff heads"),
        ({"name": "diff"}, {"head_dim": 7}, "model.d_model: 96 is not divisible by 2 x head_dim = 14"),
        ({"name": "diff", "lambda_init": "exp_dept"}, {}, "did you mean 'exp_depth'"),
        (
            {"name": "diff"},
            {"backend": "flash"},
            "model.attention.backend: unknown attention backend 'flash'",
        ),
    ],
)
def test_configuration_errors(spec, structure, message):
    kwargs = {"d_model": D_MODEL, "head_dim": HEAD_DIM, "layer_idx": 0, "n_layers": 2} | structure
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        build("attention", spec, key="model.attention", **kwargs)


def counted_flops(module, seq_len: int) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        module(torch.randn(1, seq_len, module.d_model))
    return counter.get_total_flops()


@pytest.mark.parametrize("n_kv_heads", [None, 2], ids=["mha", "gqa"])
def test_flops_match_flop_counter_and_a_transformer(n_kv_heads):
    seq = 33
    diff = build(
        "attention",
        {"name": "diff", "n_kv_heads": n_kv_heads},
        d_model=D_MODEL,
        head_dim=HEAD_DIM,
        layer_idx=0,
        n_layers=1,
        backend="math",
    )
    assert diff.flops(seq) == pytest.approx(counted_flops(diff, seq), rel=0.01)
    # A Transformer with twice the heads (of width d) and twice the kv heads has the same FLOPs (Section 2.1).
    softmax = build(
        "attention",
        {"name": "softmax", "n_kv_heads": n_kv_heads and 2 * n_kv_heads},
        d_model=D_MODEL,
        head_dim=HEAD_DIM,
        backend="math",
    )
    assert softmax.n_heads == 2 * diff.n_heads
    assert diff.flops(seq) == softmax.flops(seq)
    assert counted_flops(diff, seq) == counted_flops(softmax, seq)
