"""`attend_with_maps` (ablate.core.contract) of softmax and differential attention, against float64 formulas
written here: logits Q K^T / sqrt(d), effective maps, output; the logit transform; equality with forward."""

from __future__ import annotations

import math

import pytest
import torch
from attention_setup import build_attention

from ablate.core.contract import AnalysableAttention, causal_mask

D_MODEL, HEAD_DIM, BATCH, SEQ = 96, 8, 2, 7


def make(name: str, *, backend: str = "math", n_kv_heads=None, per_head_norm: bool = True, seed: int = 0):
    spec = {"name": name, "n_kv_heads": n_kv_heads, "per_head_norm": per_head_norm}
    module = build_attention(
        spec, D_MODEL, HEAD_DIM, layer_idx=2, n_layers=4, position="rope", backend=backend, seed=seed
    )
    with (
        torch.no_grad()
    ):  # every parameter matters: λ far from λ_init, norm weight not ones, out_proj non-zero
        for pname, p in module.named_parameters():
            if pname.startswith("lambda_"):
                p.normal_(0.0, 0.3)
            elif pname == "subln.weight":
                p.normal_(1.0, 0.2)
            else:
                p.normal_(0.0, 0.3)
    return module


def _rms64(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _softmax64(logits: torch.Tensor) -> torch.Tensor:
    n = logits.shape[-1]
    above = torch.tensor([[j > i for j in range(n)] for i in range(n)])
    return logits.masked_fill(above, float("-inf")).softmax(-1)


def softmax_maps64(module, x, reference, transform=None):
    """Per head in float64: logits_i = rope(Q_i) rope(K_g)^T / sqrt(d), A_i = softmax, out = Σ norm(A_i V_g) W_o."""
    p = {n: t.detach().double() for n, t in module.named_parameters()}
    x = x.double()
    q, k, v = x @ p["q_proj.weight"].T, x @ p["k_proj.weight"].T, x @ p["v_proj.weight"].T
    heads, kv = module.n_heads, module.n_kv_heads
    w = module.head_width
    logits, maps, outs = [], [], []
    for i in range(heads):
        g = i // (heads // kv)
        qi = reference.rope(q[..., i * w : (i + 1) * w], "interleaved")
        kg = reference.rope(k[..., g * w : (g + 1) * w], "interleaved")
        s = qi @ kg.transpose(-1, -2) / math.sqrt(w)
        s = transform(s) if transform else s
        a = _softmax64(s)
        head = a @ v[..., g * w : (g + 1) * w]
        outs.append(_rms64(head, p["subln.weight"]) if module.subln is not None else head)
        logits.append(s)
        maps.append(a)
    out = torch.cat(outs, -1) @ p["out_proj.weight"].T
    return out, torch.stack(logits, 1), torch.stack(maps, 1)


def diff_maps64(module, x, reference, transform=None):
    """Eq. 1-3 in float64 with the maps: head i's Q1, Q2 are sub-heads 2i, 2i+1; its kv group g has K1, K2
    as sub-heads 2g, 2g+1 and V of width 2d."""
    p = {n: t.detach().double() for n, t in module.named_parameters()}
    x = x.double()
    d, h, h_kv = module.head_dim, module.n_heads, module.n_kv_heads
    q, k, v = x @ p["q_proj.weight"].T, x @ p["k_proj.weight"].T, x @ p["v_proj.weight"].T
    lam = (
        torch.exp((p["lambda_q1"] * p["lambda_k1"]).sum())
        - torch.exp((p["lambda_q2"] * p["lambda_k2"]).sum())
        + module.lambda_init
    )

    def sub(t, j):
        return reference.rope(t[..., j * d : (j + 1) * d], "interleaved")

    l1, l2, eff, outs = [], [], [], []
    for i in range(h):
        g = i // (h // h_kv)
        s1 = sub(q, 2 * i) @ sub(k, 2 * g).transpose(-1, -2) / math.sqrt(d)
        s2 = sub(q, 2 * i + 1) @ sub(k, 2 * g + 1).transpose(-1, -2) / math.sqrt(d)
        if transform:
            s1, s2 = transform(s1), transform(s2)
        e = _softmax64(s1) - lam * _softmax64(s2)
        head = e @ v[..., g * 2 * d : (g + 1) * 2 * d]
        head = _rms64(head, p["subln.weight"]) if module.subln is not None else head
        outs.append(head * (1 - module.lambda_init))
        l1.append(s1)
        l2.append(s2)
        eff.append(e)
    out = torch.cat(outs, -1) @ p["out_proj.weight"].T
    return out, (torch.stack(l1, 1), torch.stack(l2, 1)), torch.stack(eff, 1)


def _x(seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(BATCH, SEQ, D_MODEL)


def _with_maps(name: str, n_kv_heads, norm: bool):
    """The math backend's `name` (analysable), an input, and its output with its maps."""
    module = make(name, n_kv_heads=n_kv_heads, per_head_norm=norm)
    assert isinstance(module, AnalysableAttention)
    x = _x()
    return module, x, module.attend_with_maps(x)


@pytest.mark.parametrize(("n_kv_heads", "norm"), [(None, True), (None, False), (3, True), (3, False)])
def test_softmax_maps_match_float64_and_forward(reference, n_kv_heads, norm):
    module, x, (out, maps) = _with_maps("softmax", n_kv_heads, norm)
    ref_out, ref_logits, ref_maps = softmax_maps64(module, x, reference)
    (logits,) = maps.logits
    assert logits.shape == (BATCH, module.n_heads, SEQ, SEQ) and logits.dtype == torch.float32
    causal = causal_mask(SEQ)
    assert torch.allclose(logits[..., causal].double(), ref_logits[..., causal], rtol=1e-5, atol=1e-5)
    assert torch.allclose(maps.effective.double(), ref_maps, atol=1e-6)
    assert torch.all(maps.effective[..., ~causal] == 0)
    assert reference.rel_err(out, ref_out) < 1e-5
    assert torch.equal(out, module(x))  # the math backend: bit for bit
    sdpa = make("softmax", backend="sdpa", n_kv_heads=n_kv_heads, per_head_norm=norm)
    assert torch.allclose(sdpa.attend_with_maps(x)[0], sdpa(x), atol=1e-5)  # any backend: same function


@pytest.mark.parametrize(("n_kv_heads", "norm"), [(None, True), (None, False), (3, True), (3, False)])
def test_diff_maps_match_float64_and_forward(reference, n_kv_heads, norm):
    module, x, (out, maps) = _with_maps("diff", n_kv_heads, norm)
    ref_out, (ref_l1, ref_l2), ref_eff = diff_maps64(module, x, reference)
    assert len(maps.logits) == 2
    causal = causal_mask(SEQ)
    for got, want in zip(maps.logits, (ref_l1, ref_l2)):
        assert got.shape == (BATCH, module.n_heads, SEQ, SEQ) and got.dtype == torch.float32
        assert torch.allclose(got[..., causal].double(), want[..., causal], rtol=1e-5, atol=1e-5)
    assert torch.allclose(maps.effective.double(), ref_eff, atol=1e-5)
    assert torch.all(maps.effective[..., ~causal] == 0)
    assert maps.effective.min() < 0  # A1 - λ A2 really subtracts
    assert reference.rel_err(out, ref_out) < 1e-5
    assert torch.equal(out, module(x))  # the math backend: bit for bit
    fused = make("diff", backend="sdpa", n_kv_heads=n_kv_heads, per_head_norm=norm)
    assert torch.allclose(fused.attend_with_maps(x)[0], fused(x), atol=1e-5)


@pytest.mark.parametrize("name", ["softmax", "diff"])
def test_identity_transform_changes_nothing(name):
    module = make(name, n_kv_heads=3)
    x = _x(2)
    out, maps = module.attend_with_maps(x)
    out_id, maps_id = module.attend_with_maps(x, logit_transform=lambda t: t)
    assert torch.equal(out, out_id)
    assert all(torch.equal(a, b) for a, b in zip(maps.logits, maps_id.logits))
    assert torch.equal(maps.effective, maps_id.effective)


@pytest.mark.parametrize("name", ["softmax", "diff"])
def test_transform_is_applied_before_mask_and_softmax(reference, name):
    """A transform that rounds logits to 0.5 steps: the output is the float64 formula on rounded logits."""
    module = make(name, n_kv_heads=3)
    x = _x(3)
    seen = []

    def coarse(t: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(t.shape))
        return torch.round(t * 2) / 2

    out, maps = module.attend_with_maps(x, logit_transform=coarse)
    expected_calls = 1 if name == "softmax" else 2
    assert seen == [(BATCH, module.n_heads, SEQ, SEQ)] * expected_calls  # (batch, heads, seq, seq), every map
    for logits in maps.logits:  # the maps returned are the transformed logits
        assert torch.equal(logits, torch.round(logits * 2) / 2)
    formula = softmax_maps64 if name == "softmax" else diff_maps64
    ref_out = formula(module, x, reference, transform=lambda t: torch.round(t * 2) / 2)[0]
    plain = module.attend_with_maps(x)[0]
    assert reference.rel_err(out, ref_out) < 1e-5
    assert not torch.allclose(out, plain, atol=1e-4)  # the rounding did change the output
