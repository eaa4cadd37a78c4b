"""The `combined` core (both maps kept per query block, combined before V, one autograd Function) against
float64 formulas written here: outputs and gradients of q, k, v and λ with several batch chunks and causal
blocks (a partial last one included), GQA, bf16; and where `auto` picks it."""

from __future__ import annotations

import math

import pytest
import torch

from ablate.core.registry import build
from components.attention import backends, combined

CPU = torch.device("cpu")


def diff64(q1, q2, k1, k2, v, lam):
    """Eq. 1 in float64: (softmax(Q1 K1^T / sqrt(d)) - λ softmax(Q2 K2^T / sqrt(d))) V, causal; query head i
    reads kv head i // (h / h_kv), by repeating k and v explicitly."""
    repeat = q1.shape[1] // k1.shape[1]
    n = q1.shape[2]
    causal = torch.ones(n, n, dtype=torch.bool).triu(1)

    def maps(q, k):
        scores = q @ k.repeat_interleave(repeat, 1).transpose(-1, -2) / math.sqrt(q.shape[-1])
        return scores.masked_fill(causal, float("-inf")).softmax(-1)

    return (maps(q1, k1) - lam * maps(q2, k2)) @ v.repeat_interleave(repeat, 1)


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def check(dtype, *, batch, h, kv_heads, n, d, chunk=None, block=None, tol_out=1e-6, tol_grad=1e-5):
    torch.manual_seed(batch * 1000 + h * 100 + kv_heads * 10 + n)
    q1, q2 = (torch.randn(batch, h, n, d) for _ in range(2))
    k1, k2 = (torch.randn(batch, kv_heads, n, d) for _ in range(2))
    v = torch.randn(batch, kv_heads, n, 2 * d)
    lam = torch.tensor(0.37)
    inputs = [t.to(dtype).requires_grad_() for t in (q1, q2, k1, k2, v)] + [lam.requires_grad_()]
    i64 = [t.detach().double().requires_grad_() for t in inputs]
    q, k = torch.stack(inputs[0:2], 1), torch.stack(inputs[2:4], 1)
    out = combined.attention(q.unflatten(2, (kv_heads, -1)), k, inputs[4], lam, chunk=chunk, block=block)
    out = out.flatten(1, 2)
    expected = diff64(*i64)
    assert out.shape == (batch, h, n, 2 * d) and out.dtype == dtype
    assert rel(out, expected) < tol_out
    g = torch.randn(out.shape)
    actual = torch.autograd.grad((out.float() * g).sum(), inputs)
    wanted = torch.autograd.grad((expected * g.double()).sum(), i64)
    for name, a, w in zip("q1 q2 k1 k2 v λ".split(), actual, wanted):
        assert a.dtype == (torch.float32 if name == "λ" else dtype), name
        assert rel(a, w) < tol_grad, name


@pytest.mark.parametrize(
    "chunk, block", [(None, None), (1, 4), (2, 5), (3, 16)], ids=["defaults", "1x4", "2x5", "3x16"]
)
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_combined_matches_eq1_and_its_gradients(chunk, block, kv_heads):
    """Chunks of 2 of 3 batch rows and blocks of 5 of 13 queries leave a partial last chunk and block."""
    check(torch.float32, batch=3, h=4, kv_heads=kv_heads, n=13, d=4, chunk=chunk, block=block)


def test_combined_in_bf16():
    """bf16 maps and GEMMs, dK and dλ accumulated in float32: within bf16's precision of the float64 truth."""
    check(torch.bfloat16, batch=2, h=2, kv_heads=1, n=24, d=8, chunk=1, block=8, tol_out=2e-2, tol_grad=3e-2)


def test_combined_rejects_one_map():
    q = torch.randn(1, 1, 1, 1, 4, 2)
    with pytest.raises(ValueError, match="need two maps"):
        combined.attention(q, torch.randn(1, 1, 1, 4, 2), torch.randn(1, 1, 4, 4), torch.tensor(0.5))


def test_auto_picks_combined_for_short_cpu_sequences():
    """benchmarks/NOTES.md, "The `combined` core": fastest at sequence 256 in float32, and
    in bf16 without AMX; longer or unknown lengths, AMX bf16 and CUDA keep their rules."""

    def auto(dtype, seq_len, *, amx=False, device=CPU, head_dim=32):
        return backends.resolve("auto", device, dtype, diff=True, head_dim=head_dim, amx=amx, seq_len=seq_len)

    for head_dim in (16, 32, 64):
        assert auto(torch.float32, 256, head_dim=head_dim) == "combined"
        assert auto(torch.float32, 256, head_dim=head_dim, amx=True) == "combined"
        assert auto(torch.bfloat16, 256, head_dim=head_dim) == "combined"
    assert auto(torch.float32, 257) == auto(torch.float32, None) == "sdpa_padded"
    assert auto(torch.bfloat16, 256, amx=True) == "blockwise"
    assert auto(torch.bfloat16, 1024) == "blocks"
    assert backends.resolve("auto", CPU, torch.float32, head_dim=32, seq_len=256) == "sdpa"  # softmax
    assert backends.resolve("combined", CPU, torch.float32) == "combined"
    module = build("attention", "diff", d_model=64, head_dim=16, layer_idx=0, n_layers=1)
    assert module.resolved_backend(CPU, torch.float32, seq_len=256) == "combined"
    assert module.resolved_backend(CPU, torch.float32) == "sdpa_padded"
