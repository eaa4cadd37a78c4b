"""Diff V2 attention against a float64 implementation written here from docs/paper.md's description."""

from __future__ import annotations

import math

import pytest
import torch
from attention_setup import build_attention
from torch.utils.flop_counter import FlopCounterMode

from ablate.core.contract import counted_flops
from ablate.core.errors import UserError
from ablate.model.interop import load_reference_diff_v2_attention
from components.attention.diff_v2 import DiffV2Attention

D_MODEL, HEAD_DIM = 64, 8  # h = 8 output heads (16 query heads of width 8) with heads_mult 1
BATCH, SEQ = 2, 9
BACKENDS = ["math", "sdpa", "sdpa_padded", "blockwise", "blocks", "combined", "flash_attn", "auto"]


def make(*, backend="math", n_kv_heads=None, heads_mult=1.0, position="rope", seed=0) -> DiffV2Attention:
    spec = {"name": "diff_v2", "n_kv_heads": n_kv_heads, "heads_mult": heads_mult}
    module = build_attention(
        spec, D_MODEL, HEAD_DIM, layer_idx=2, n_layers=4, position=position, backend=backend, seed=seed
    )
    with torch.no_grad():  # sizeable weights, so σ spreads over (0, 1) and every map matters
        for p in module.parameters():
            p.normal_(0.0, 0.3)
    return module


def v2_reference(x, p, *, h, h_kv, d, rope, rope_ref):
    """Float64, loops over heads: query head j (of 2h) reads kv head j // (2h / h_kv); output head i is
    softmax(Q_2i K^T) V - sigmoid(x W_λ^T)_i softmax(Q_2i+1 K^T) V, per token; heads concatenated, o_proj."""
    n = x.shape[1]
    q, k, v = x @ p["q_proj.weight"].T, x @ p["k_proj.weight"].T, x @ p["v_proj.weight"].T
    sigma = torch.sigmoid(x @ p["lambda_proj.weight"].T)  # (B,N,h)
    future = torch.tensor([[j > i for j in range(n)] for i in range(n)])

    def head(t, j):
        part = t[..., j * d : (j + 1) * d]
        return rope_ref(part, "interleaved") if rope else part

    def attn(j):
        kv = j // (2 * h // h_kv)
        scores = head(q, j) @ head(k, kv).transpose(-1, -2) / math.sqrt(d)
        weights = scores.masked_fill(future, float("-inf")).softmax(-1)
        return weights @ v[..., kv * d : (kv + 1) * d]

    outs = [attn(2 * i) - sigma[..., i : i + 1] * attn(2 * i + 1) for i in range(h)]
    return torch.cat(outs, dim=-1) @ p["o_proj.weight"].T


def compare(module, reference, *, h_kv, rope=True, forward=None):
    torch.manual_seed(1)
    x, g = torch.randn(BATCH, SEQ, D_MODEL), torch.randn(BATCH, SEQ, D_MODEL)
    x32 = x.clone().requires_grad_()
    out = (forward or module)(x32)
    (out * g).sum().backward()
    params = {n: t.detach().double().requires_grad_() for n, t in module.named_parameters()}
    x64 = x.double().requires_grad_()
    ref = v2_reference(
        x64, params, h=module.n_heads, h_kv=h_kv, d=HEAD_DIM, rope=rope, rope_ref=reference.rope
    )
    (ref * g.double()).sum().backward()
    pairs = {"output": (out, ref), "grad x": (x32.grad, x64.grad)}
    pairs.update({f"grad {n}": (t.grad, params[n].grad) for n, t in module.named_parameters()})
    assert set(params) == {
        "q_proj.weight",
        "k_proj.weight",
        "v_proj.weight",
        "o_proj.weight",
        "lambda_proj.weight",
    }
    for what, (actual, expected) in pairs.items():
        assert reference.rel_err(actual, expected) < 1e-5, what


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("n_kv_heads", "heads_mult"),
    [(None, 1.0), (2, 1.0), (4, 1.0), (None, 0.5), (1, 0.5)],
    ids=["mha", "gqa2", "gqa4", "mha-half", "gqa1-half"],
)
def test_matches_the_description(reference, fake_flash, backend, n_kv_heads, heads_mult):
    module = make(backend=backend, n_kv_heads=n_kv_heads, heads_mult=heads_mult)
    h = int(D_MODEL * heads_mult // HEAD_DIM)
    compare(module, reference, h_kv=n_kv_heads or h)
    if backend == "flash_attn":  # one call over the 2h query heads, causal, with the h_kv kv heads
        assert fake_flash and all(
            c["q"][2] == 2 * h and c["k"][2] == (n_kv_heads or h) and c["causal"] for c in fake_flash
        )


def test_without_position_encoding(reference):
    compare(make(position="none", n_kv_heads=2), reference, h_kv=2, rope=False)


@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_attend_with_maps_is_forward_and_its_maps(reference, n_kv_heads):
    module = make(n_kv_heads=n_kv_heads)
    compare(module, reference, h_kv=n_kv_heads or 8, forward=lambda x: module.attend_with_maps(x)[0])
    x = torch.randn(1, SEQ, D_MODEL, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out, maps = module.attend_with_maps(x)
        (logits,) = maps.logits
        assert logits.shape == (1, 16, SEQ, SEQ) and maps.effective.shape == (1, 8, SEQ, SEQ)
        torch.testing.assert_close(out, module(x), rtol=1e-5, atol=1e-6)
        # effective rows: A_2i - σ A_2i+1, zero above the diagonal, summing to 1 - σ per query row
        sigma = torch.sigmoid(x @ module.lambda_proj.weight.T)[0].T  # (h, N)
        torch.testing.assert_close(maps.effective[0].sum(-1), 1 - sigma, rtol=1e-5, atol=1e-6)
        assert (maps.effective[0].triu(1) == 0).all()
        # logits are q k^T / sqrt(d) of the rotated heads: head 2i+1 and 2i use the same kv head
        q, k, _ = module.project(x)
        group = 16 // (n_kv_heads or 8)
        torch.testing.assert_close(logits[0, 5], q[0, 5] @ k[0, 5 // group].T / math.sqrt(HEAD_DIM))
        # a logit transform changes the output through the maps
        flat, _ = module.attend_with_maps(x, logit_transform=torch.zeros_like)
        assert not torch.allclose(flat, out)


def test_layout_and_contract():
    module = make(n_kv_heads=2)
    shapes = {n: tuple(p.shape) for n, p in module.named_parameters()}
    assert shapes == {
        "q_proj.weight": (128, 64),
        "k_proj.weight": (16, 64),
        "v_proj.weight": (16, 64),
        "o_proj.weight": (64, 64),
        "lambda_proj.weight": (8, 64),
    }
    assert module.residual_out == ("o_proj.weight",)
    assert module.describe() == {
        "heads": "8 (16 q)",
        "width": 8,
        "per_head_norm": False,
        "lambda": "sigmoid(λ_proj x)",
    }
    half = make(heads_mult=0.5)
    assert (half.n_heads, half.q_proj.out_features, half.o_proj.in_features) == (4, 64, 32)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"heads_mult": 0.3}, "model.attention.heads_mult"),
        ({"n_kv_heads": 3}, "model.attention.n_kv_heads: 3 does not divide 8"),
        ({"backend": "fast"}, "unknown attention backend 'fast'"),
    ],
)
def test_configuration_errors(options, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        DiffV2Attention(d_model=D_MODEL, head_dim=HEAD_DIM, **options)


@pytest.mark.parametrize(("n_kv_heads", "heads_mult"), [(None, 1.0), (2, 1.0), (None, 0.5)])
def test_flops_match_flop_counter(n_kv_heads, heads_mult):
    module, seq = make(n_kv_heads=n_kv_heads, heads_mult=heads_mult), 32
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        module(torch.randn(1, seq, D_MODEL))
    assert module.flops(seq) == pytest.approx(counter.get_total_flops(), rel=0.01)
    assert module.flops(seq) == pytest.approx(counted_flops(module, seq, D_MODEL), rel=0.01)


# --- the authors' layout ------------------------------------------------------------------------------


def authors_state_dict(h: int, h_kv: int, d: int, d_model: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors shaped as docs/paper.md describes the authors' Diff V2 module."""
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "q_proj.weight": (2 * h * d, d_model),
        "k_proj.weight": (h_kv * d, d_model),
        "v_proj.weight": (h_kv * d, d_model),
        "o_proj.weight": (d_model, h * d),
        "lambda_proj.weight": (h, d_model),
    }
    return {name: torch.randn(shape, generator=g) * 0.3 for name, shape in shapes.items()}


@pytest.mark.parametrize("backend", ["math", "auto"])
@pytest.mark.parametrize(("h", "h_kv"), [(8, None), (8, 8), (8, 2), (4, 1)])
def test_loader_reproduces_the_description(reference, backend, h, h_kv):
    sd = authors_state_dict(h, h_kv or h, HEAD_DIM, D_MODEL)
    module = load_reference_diff_v2_attention(
        sd, d_model=D_MODEL, num_heads=h, num_kv_heads=h_kv, head_dim=HEAD_DIM, backend=backend
    )
    assert not module.training and type(module.position).__name__ == "NoPosition"
    x = torch.randn(2, 10, D_MODEL, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = module(x)
    ref = v2_reference(
        x.double(),
        {n: t.double() for n, t in sd.items()},
        h=h,
        h_kv=h_kv or h,
        d=HEAD_DIM,
        rope=False,
        rope_ref=reference.rope,
    )
    assert reference.rel_err(out, ref) < 1e-5


def test_loader_names_what_does_not_fit():
    sd = authors_state_dict(8, 8, HEAD_DIM, D_MODEL)
    sd["lambda_proj.weight"] = torch.zeros(4, D_MODEL)
    sd.pop("o_proj.weight")
    sd["subln.weight"] = torch.ones(16)
    with pytest.raises(UserError) as info:
        load_reference_diff_v2_attention(
            sd, d_model=D_MODEL, num_heads=8, num_kv_heads=None, head_dim=HEAD_DIM
        )
    message = str(info.value)
    assert "missing o_proj.weight" in message and "unexpected subln.weight" in message
    assert "mis-shaped lambda_proj.weight (4, 64) (expected (8, 64))" in message and "\n" not in message
