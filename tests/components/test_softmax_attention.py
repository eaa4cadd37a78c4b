"""Softmax attention against an independent float64 implementation (conftest.softmax_ref)."""

from __future__ import annotations

import pytest
import torch
from attention_setup import build_attention, run_fp32

from ablate.core.errors import UserError
from ablate.core.registry import build

D_MODEL, HEAD_DIM = 96, 8
BATCH, SEQ = 2, 9


def make(*, backend="math", n_kv_heads=None, per_head_norm=False, head_dim_mult=1, position="rope", seed=0):
    spec = {
        "name": "softmax",
        "n_kv_heads": n_kv_heads,
        "per_head_norm": per_head_norm,
        "head_dim_mult": head_dim_mult,
    }
    module = build_attention(
        spec, D_MODEL, HEAD_DIM, layer_idx=1, n_layers=4, position=position, backend=backend, seed=seed
    )
    if module.subln is not None:
        with torch.no_grad():
            module.subln.weight.normal_(1.0, 0.2)
    return module


@pytest.mark.parametrize("position", ["rope", "none"])
@pytest.mark.parametrize("head_dim_mult", [1, 2])
@pytest.mark.parametrize("per_head_norm", [False, True], ids=["no-norm", "norm"])
@pytest.mark.parametrize(
    "backend", ["math", "sdpa", "sdpa_padded", "blockwise", "blocks", "flash_attn", "auto"]
)
@pytest.mark.parametrize("n_kv_heads", [None, 2], ids=["mha", "gqa"])
def test_matches_reference(
    reference, fake_flash, n_kv_heads, backend, per_head_norm, head_dim_mult, position
):
    module = make(
        backend=backend,
        n_kv_heads=n_kv_heads,
        per_head_norm=per_head_norm,
        head_dim_mult=head_dim_mult,
        position=position,
    )
    width = HEAD_DIM * head_dim_mult
    heads = D_MODEL // width  # 12 heads of 8 or 6 heads of 16
    assert (module.n_heads, module.head_width) == (heads, width)
    torch.manual_seed(1)
    x, g = torch.randn(BATCH, SEQ, D_MODEL), torch.randn(BATCH, SEQ, D_MODEL)
    out, x32, x64, params = run_fp32(module, x, g)
    ref = reference.softmax(
        x64,
        params,
        heads=heads,
        kv_heads=n_kv_heads or heads,
        width=width,
        norm=per_head_norm,
        rope="interleaved" if position == "rope" else None,
    )
    (ref * g.double()).sum().backward()
    assert reference.rel_err(out, ref) < 1e-5
    assert reference.rel_err(x32.grad, x64.grad) < 1e-5
    assert len(params) == 4 + per_head_norm
    for name, p in module.named_parameters():
        assert reference.rel_err(p.grad, params[name].grad) < 1e-5, name
    assert bool(fake_flash) == (backend == "flash_attn")
    for call in fake_flash:
        assert call["q"][2] == heads and call["k"][2] == (n_kv_heads or heads)  # GQA kept native


def test_return_weights_are_causal_distributions():
    module = make(n_kv_heads=3)
    x = torch.randn(BATCH, SEQ, D_MODEL)
    out, weights = module(x, return_weights=True)
    assert weights.shape == (BATCH, 12, SEQ, SEQ)
    torch.testing.assert_close(weights.sum(-1), torch.ones(BATCH, 12, SEQ))
    upper = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)
    assert (weights[..., upper] == 0).all() and (weights[..., ~upper] > 0).all()
    torch.testing.assert_close(out, module(x))
    module.backend = "sdpa"  # documented: the maps come from the math form whatever the backend
    out_sdpa, weights_sdpa = module(x, return_weights=True)
    torch.testing.assert_close(out_sdpa, out)
    torch.testing.assert_close(weights_sdpa, weights)


def test_layout_and_contract():
    module = make(n_kv_heads=3, per_head_norm=True, head_dim_mult=2)
    shapes = {n: tuple(t.shape) for n, t in module.state_dict().items()}
    assert shapes == {
        "q_proj.weight": (D_MODEL, D_MODEL),
        "k_proj.weight": (3 * 16, D_MODEL),
        "v_proj.weight": (3 * 16, D_MODEL),
        "out_proj.weight": (D_MODEL, D_MODEL),
        "subln.weight": (16,),
    }
    assert module.residual_out == ("out_proj.weight",)
    assert module.position.head_dim == 16  # RoPE built with the head width, not model.head_dim


@pytest.mark.parametrize(
    ("options", "structure", "message"),
    [
        ({"n_kv_heads": 5}, {}, "model.attention.n_kv_heads: 5 does not divide 12 heads"),
        ({"n_kv_heads": 0}, {}, "model.attention.n_kv_heads: expected a positive integer"),
        ({"head_dim_mult": 5}, {}, "model.d_model: 96 is not divisible by the head width 40"),
        ({}, {"position": "rotary"}, "model.position: unknown position 'rotary'"),
        ({}, {"position": {"name": "rope", "style": "gptj"}}, "interleaved, rotate_half"),
        ({}, {"backend": "sdpa2"}, "did you mean 'sdpa'"),
    ],
)
def test_configuration_errors(options, structure, message):
    kwargs = {"d_model": D_MODEL, "head_dim": HEAD_DIM, "layer_idx": 0, "n_layers": 2} | structure
    with pytest.raises(UserError, match=message):
        build("attention", {"name": "softmax", **options}, key="model.attention", **kwargs)


@pytest.mark.parametrize(("n_kv_heads", "head_dim_mult"), [(None, 1), (3, 1), (None, 2)])
def test_flops_match_flop_counter(n_kv_heads, head_dim_mult):
    from torch.utils.flop_counter import FlopCounterMode

    module = make(n_kv_heads=n_kv_heads, head_dim_mult=head_dim_mult, per_head_norm=True)
    seq = 33
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        module(torch.randn(1, seq, D_MODEL))
    assert module.flops(seq) == pytest.approx(counter.get_total_flops(), rel=0.01)
