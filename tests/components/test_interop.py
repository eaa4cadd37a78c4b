"""Loading reference-layout (microsoft/unilm Diff-Transformer) weights, and the GQA sub-head pairing."""

from __future__ import annotations

import math

import pytest
import torch
from attention_setup import reference_diff_shapes

from ablate.core.errors import UserError
from ablate.model.interop import load_reference_diff_attention

EMBED, HEADS = 96, 6  # reference: num_heads = 6 diff heads, head_dim = 96 // 6 // 2 = 8
HEAD_DIM = EMBED // HEADS // 2


def reference_state_dict(num_kv_heads: int | None, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors shaped as the reference's MultiheadFlashDiff2 (k/v: embed_dim // n_rep rows)."""
    g = torch.Generator().manual_seed(seed)
    rep = HEADS // (num_kv_heads or HEADS)
    shapes = reference_diff_shapes(EMBED, EMBED // rep, HEAD_DIM)
    sd = {name: torch.randn(shape, generator=g) * 0.3 for name, shape in shapes.items()}
    sd["subln.weight"] += 1.0
    return sd


@pytest.mark.parametrize("backend", ["math", "auto"])
@pytest.mark.parametrize("num_kv_heads", [None, 6, 3, 2], ids=["default", "mha", "gqa3", "gqa2"])
def test_reference_weights_reproduce_the_equations(reference, num_kv_heads, backend):
    sd = reference_state_dict(num_kv_heads)
    depth = 4
    module = load_reference_diff_attention(
        sd, embed_dim=EMBED, num_heads=HEADS, num_kv_heads=num_kv_heads, depth=depth, backend=backend
    )
    assert not module.training
    assert module.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * depth))
    assert module.lambda_q1.dtype == torch.float32
    x = torch.randn(2, 10, EMBED, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = module(x)
    params = {n: t.double() for n, t in sd.items()}
    h_kv = num_kv_heads or HEADS
    expected = reference.diff(
        x.double(), params, h=HEADS, h_kv=h_kv, lam_init=module.lambda_init, norm=True, rope=None
    )
    assert reference.rel_err(out, expected) < 1e-5


@pytest.mark.parametrize("num_kv_heads", [3, 2, 1])
def test_gqa_pairs_q1_with_k1_of_the_same_group(reference, num_kv_heads):
    """The naive file's pairing (K repeated after splitting into sub-heads) must give a different result."""
    sd = reference_state_dict(num_kv_heads, seed=2)
    module = load_reference_diff_attention(
        sd, embed_dim=EMBED, num_heads=HEADS, num_kv_heads=num_kv_heads, depth=0
    )
    x = torch.randn(1, 10, EMBED, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = module(x)
    params = {n: t.double() for n, t in sd.items()}
    kwargs = {"h": HEADS, "h_kv": num_kv_heads, "lam_init": 0.2, "norm": True, "rope": None}
    right = reference.diff(x.double(), params, pairing="flash", **kwargs)
    naive = reference.diff(x.double(), params, pairing="naive", **kwargs)
    assert reference.rel_err(out, right) < 1e-5
    assert reference.rel_err(naive, right) > 1e-2  # the two pairings really differ on these weights
    assert reference.rel_err(out, naive) > 1e-2


def test_mistakes_are_listed():
    sd = reference_state_dict(2)
    sd.pop("lambda_k2")
    sd["lambda_init"] = torch.tensor(0.2)
    sd["k_proj.weight"] = torch.zeros(EMBED, EMBED)  # as if num_kv_heads were 6
    with pytest.raises(UserError) as e:
        load_reference_diff_attention(sd, embed_dim=EMBED, num_heads=HEADS, num_kv_heads=2, depth=0)
    message = str(e.value)
    assert "missing lambda_k2" in message
    assert "unexpected lambda_init" in message
    assert "mis-shaped k_proj.weight (96, 96) (expected (32, 96))" in message
    assert "v_proj" not in message


def test_bad_head_counts():
    with pytest.raises(UserError, match="n_kv_heads: 4 does not divide 6 diff heads"):
        load_reference_diff_attention(
            reference_state_dict(None), embed_dim=EMBED, num_heads=HEADS, num_kv_heads=4, depth=0
        )
    with pytest.raises(UserError, match="num_heads"):
        load_reference_diff_attention(
            reference_state_dict(None), embed_dim=EMBED, num_heads=5, num_kv_heads=None, depth=0
        )
