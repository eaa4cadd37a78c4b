"""The fast attention paths beyond the equivalence tests: the `blockwise` core (query blocks in PyTorch
operations) against float64 formulas with several blocks and a partial last block, GQA, both attention
kinds; that no fused path keeps an N x N map for backward; what `auto` picks; bf16 error of the
blockwise and padded paths no worse than split-V SDPA's."""

from __future__ import annotations

import math

import pytest
import torch
from attention_setup import run_fp32

from ablate.core.registry import build
from components.attention import backends, blockwise, sdpa

CUDA = torch.device("cuda")  # a device object only: nothing runs on it


def causal_maps64(q, k):
    """softmax(Q K^T / sqrt(d)) with a causal mask, float64; q (B,H,N,d), k (B,G,N,d), head i reads group
    i // (H / G), by repeating k explicitly."""
    q, k = q.double(), k.double().repeat_interleave(q.shape[1] // k.shape[1], 1)
    n = q.shape[2]
    scores = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.shape[-1])
    return scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def grads(out, inputs, g):
    return torch.autograd.grad((out * g).sum(), inputs)


def use(monkeypatch, block: int, forward: str) -> None:
    """Blocks of `block` query rows; forward by SDPA's fused kernel ("fused") or by the blocks too."""
    monkeypatch.setattr(blockwise, "BLOCK", block)
    if forward == "blocks":
        monkeypatch.setattr(sdpa, "_on_sdpa", lambda q: False)


@pytest.mark.parametrize("forward", ["fused", "blocks"])
@pytest.mark.parametrize("block", [3, 4, 16])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_softmax_attention_in_blocks(monkeypatch, block, kv_heads, forward):
    use(monkeypatch, block, forward)
    torch.manual_seed(0)
    n = 13  # 13 = 4 x 3 + 1 = 3 x 4 + 1: a partial last block; 16 > 13: one block
    q = torch.randn(2, 4, n, 8, requires_grad=True)
    k = torch.randn(2, kv_heads, n, 8, requires_grad=True)
    v = torch.randn(2, kv_heads, n, 8, requires_grad=True)
    g = torch.randn(2, 4, n, 8)
    out = backends.attend(q, k, v, backend="blockwise")
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected = causal_maps64(q64, k64) @ v64.repeat_interleave(4 // kv_heads, 1)
    assert rel(out, expected) < 1e-6
    for actual, wanted in zip(grads(out, (q, k, v), g), grads(expected, (q64, k64, v64), g.double())):
        assert rel(actual, wanted) < 1e-5


@pytest.mark.parametrize("forward", ["fused", "blocks"])
@pytest.mark.parametrize("block", [3, 4, 16])
@pytest.mark.parametrize("kv_heads", [3, 1])
def test_diff_attention_in_blocks(monkeypatch, block, kv_heads, forward):
    """Eq. 1 with Q1 of head i against K1 of group i // (h / h_kv), Q2 against K2; gradients of q, k, v, λ."""
    use(monkeypatch, block, forward)
    torch.manual_seed(0)
    h, d, n = 3, 4, 13
    q1, q2 = torch.randn(2, h, n, d), torch.randn(2, h, n, d)
    k1, k2 = torch.randn(2, kv_heads, n, d), torch.randn(2, kv_heads, n, d)
    v = torch.randn(2, kv_heads, n, 2 * d)
    lam = torch.tensor(0.37)
    inputs = [t.requires_grad_() for t in (q1, q2, k1, k2, v, lam)]
    g = torch.randn(2, h, n, 2 * d)
    out = backends.diff_attend(q1, q2, k1, k2, v, lam, backend="blockwise")
    i64 = [t.detach().double().requires_grad_() for t in inputs]
    a1, a2 = causal_maps64(i64[0], i64[2]), causal_maps64(i64[1], i64[3])
    expected = (a1 - i64[5] * a2) @ i64[4].repeat_interleave(h // kv_heads, 1)
    assert out.shape == (2, h, n, 2 * d)
    assert rel(out, expected) < 1e-6
    for name, actual, wanted in zip(
        "q1 q2 k1 k2 v λ".split(), grads(out, inputs, g), grads(expected, i64, g.double())
    ):
        assert rel(actual, wanted) < 1e-5, name


@pytest.mark.parametrize("forward", ["fused", "blocks"])
@pytest.mark.parametrize("n_kv_heads", [None, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("kind", ["diff", "softmax"])
def test_modules_in_blocks_match_equations(reference, monkeypatch, kind, n_kv_heads, forward):
    """Whole modules (fused projection, RoPE, head norm) with blocks of 4 rows against conftest's float64 refs."""
    use(monkeypatch, 4, forward)
    d_model, head_dim, seq = 96, 8, 11
    torch.manual_seed(0)
    module = build(
        "attention",
        {"name": kind, "n_kv_heads": n_kv_heads, "per_head_norm": True},
        d_model=d_model,
        head_dim=head_dim,
        layer_idx=2,
        n_layers=4,
        backend="blockwise",
    )
    with torch.no_grad():
        module.subln.weight.normal_(1.0, 0.2)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            if hasattr(module, name):
                getattr(module, name).normal_(0.0, 0.3)
    x, g = torch.randn(2, seq, d_model), torch.randn(2, seq, d_model)
    _, x32, x64, params = run_fp32(module, x, g)
    if kind == "diff":
        h = d_model // (2 * head_dim)
        ref = reference.diff(
            x64, params, h=h, h_kv=n_kv_heads or h, lam_init=module.lambda_init, norm=True, rope="interleaved"
        )
    else:
        heads = d_model // head_dim
        ref = reference.softmax(
            x64,
            params,
            heads=heads,
            kv_heads=n_kv_heads or heads,
            width=head_dim,
            norm=True,
            rope="interleaved",
        )
    (ref * g.double()).sum().backward()
    assert reference.rel_err(module(x), ref) < 1e-5
    assert reference.rel_err(x32.grad, x64.grad) < 1e-5
    for name, p in module.named_parameters():
        assert reference.rel_err(p.grad, params[name].grad) < 1e-5, name


@pytest.mark.parametrize("backend", ["blockwise", "blocks", "sdpa_padded", "sdpa", "math"])
def test_no_n_by_n_map_is_kept_for_backward(backend):
    """Every tensor autograd saves is far smaller than one map (B, h, N, N); the math form is the check
    that the detector can fail."""
    d_model, head_dim, seq = 32, 4, 96  # h = 4 diff heads; a map is 2 x 4 x 96 x 96 = 73728 numbers
    module = build("attention", {"name": "diff"}, d_model=d_model, head_dim=head_dim, backend=backend)
    saved: list[int] = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(torch.randn(2, seq, d_model, requires_grad=True)).sum().backward()
    one_map = 2 * module.n_heads * seq * seq
    if backend == "math":
        assert max(saved) >= one_map
    else:
        assert max(saved) < one_map // 4, (max(saved), one_map)


def test_auto_on_cpu_picks_what_measured_fastest(fake_flash, monkeypatch):
    """Diff on CPU: blockwise in bf16 and for float32 sub-heads of 64, sdpa_padded for thinner float32
    sub-heads (benchmarks/NOTES.md); softmax attention: SDPA, but the query blocks for bf16 heads of 64
    without AMX; CUDA: flash-attn for half precision, else one SDPA kernel (flash, memory-efficient)."""
    cpu = torch.device("cpu")
    for amx in (True, False):  # bf16 sub-heads of 16: the fused forward wins on both kinds of CPU
        assert backends.resolve("auto", cpu, torch.bfloat16, diff=True, head_dim=16, amx=amx) == "blockwise"
    # wider bf16 sub-heads: the fused forward with AMX, the blocks' one-product forward without
    for width in (32, 64):
        assert (
            backends.resolve("auto", cpu, torch.bfloat16, diff=True, head_dim=width, amx=True) == "blockwise"
        )
        assert backends.resolve("auto", cpu, torch.bfloat16, diff=True, head_dim=width, amx=False) == "blocks"
    for amx in (True, False):  # float32 does not depend on AMX (measured with and without AVX-512)
        assert backends.resolve("auto", cpu, torch.float32, diff=True, head_dim=64, amx=amx) == "blockwise"
        assert backends.resolve("auto", cpu, torch.float32, diff=True, head_dim=32, amx=amx) == "sdpa_padded"
    assert backends.resolve("auto", cpu, torch.bfloat16, diff=True, head_dim=64) == backends.resolve(
        "auto", cpu, torch.bfloat16, diff=True, head_dim=64, amx=backends.cpu_has_amx()
    )  # unless given, AMX is read from this machine
    assert backends.resolve("auto", cpu, torch.float32, diff=True, head_dim=64) == "blockwise"
    assert backends.resolve("auto", cpu, torch.float32, diff=True, head_dim=16) == "sdpa_padded"
    for dtype in (torch.bfloat16, torch.float32):  # softmax heads up to 32: SDPA's kernel is faster
        for width in (16, 32):
            assert backends.resolve("auto", cpu, dtype, head_dim=width, amx=False) == "sdpa"
    # softmax heads of 64 in bf16: the query blocks without AMX, SDPA with it; float32: SDPA
    assert backends.resolve("auto", cpu, torch.bfloat16, head_dim=64, amx=False) == "blocks"
    assert backends.resolve("auto", cpu, torch.bfloat16, head_dim=64, amx=True) == "sdpa"
    assert backends.resolve("auto", cpu, torch.float32, head_dim=64, amx=False) == "sdpa"
    wide = build("attention", {"name": "softmax"}, d_model=128, head_dim=64)
    assert wide.resolved_backend(cpu, torch.bfloat16) == ("sdpa" if backends.cpu_has_amx() else "blocks")
    assert backends.resolve("auto", CUDA, torch.bfloat16, diff=True) == "flash_attn"
    # CUDA without flash-attn (or in float32): SDPA held to one fused kernel by dtype and width
    assert backends.resolve("auto", CUDA, torch.float32, diff=True) == "sdpa_efficient"
    monkeypatch.setattr(sdpa, "FLASH_ATTN", None)
    assert backends.resolve("auto", CUDA, torch.bfloat16, diff=True) == "sdpa_flash"
    assert backends.resolve("auto", CUDA, torch.bfloat16, diff=True, head_dim=264) == "sdpa_efficient"
    for name in ("math", "sdpa", "sdpa_padded", "blockwise", "blocks", "flash_attn"):
        assert backends.resolve(name, cpu, torch.float32, diff=True, head_dim=16) == name
    module = build("attention", {"name": "diff"}, d_model=32, head_dim=4)
    assert module.resolved_backend(cpu, torch.bfloat16) == "blockwise"
    assert module.resolved_backend(cpu, torch.float32) == "sdpa_padded"
    wide = build("attention", {"name": "diff"}, d_model=256, head_dim=64)
    assert wide.resolved_backend(cpu, torch.float32) == "blockwise"
    assert (
        build("attention", "softmax", d_model=32, head_dim=4).resolved_backend(cpu, torch.bfloat16) == "sdpa"
    )


def test_bf16_error_is_no_worse_than_sdpas(reference):
    """Under bf16 autocast the blockwise core rounds scores and dP to bf16 (no fp32-output bf16 GEMM on
    CPU); its error against float64 must stay of the order of split-V SDPA's (which keeps scores in
    float32), and so must the padded path's."""
    torch.manual_seed(0)
    d_model, head_dim, seq = 128, 16, 200
    errors = {}
    for backend in ("blockwise", "sdpa_padded", "sdpa"):
        torch.manual_seed(0)
        module = build(
            "attention", {"name": "diff"}, d_model=d_model, head_dim=head_dim, layer_idx=3, backend=backend
        )
        with torch.no_grad():  # larger logits than at initialisation: scores of a few units
            module.q_proj.weight.mul_(4.0)
        torch.manual_seed(1)
        x, g = torch.randn(1, seq, d_model), torch.randn(1, seq, d_model)
        x32 = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = module(x32)
        (out.float() * g).sum().backward()
        params = {n: t.detach().double().requires_grad_() for n, t in module.named_parameters()}
        x64 = x.double().requires_grad_()
        h = d_model // (2 * head_dim)
        ref = reference.diff(
            x64, params, h=h, h_kv=h, lam_init=module.lambda_init, norm=True, rope="interleaved"
        )
        (ref * g.double()).sum().backward()
        errors[backend] = (reference.rel_err(out, ref), reference.rel_err(x32.grad, x64.grad))
    for backend in ("blockwise", "sdpa_padded"):
        for i, what in enumerate(("output", "grad x")):
            assert errors[backend][i] < 2.0 * errors["sdpa"][i] + 2e-3, (backend, what, errors)
            assert errors[backend][i] < 3e-2, (backend, what, errors)


def test_cpu_has_amx_reads_the_flags_line():
    amx = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
    epyc = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\nbugs\t\t: amx_bf16_is_not_here\n"
    assert backends.cpu_has_amx(amx) is True
    assert backends.cpu_has_amx(epyc) is False and backends.cpu_has_amx("") is False
