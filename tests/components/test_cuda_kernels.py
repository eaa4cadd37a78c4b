"""SDPA held to one fused kernel (`sdpa_flash`, `sdpa_efficient`, `sdpa_cudnn`) and `auto`'s choice on
CUDA: the calls the CUDA kernels receive, driven on CPU through the `restrict_sdpa` seam (CPU has only the
flash kernel), outputs and gradients against float64 formulas written here."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ablate.core.errors import UserError
from ablate.core.registry import build
from components.attention import backends, sdpa

CUDA = torch.device("cuda")  # a device object only: nothing runs on it
HELD = ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn")


def causal64(q, k, v):
    """softmax(Q K^T / sqrt(width)) V, causal, float64; kv heads repeated to the query heads."""
    q, k, v = q.double(), k.double(), v.double()
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], 1) for t in (k, v))
    n = q.shape[2]
    scores = torch.einsum("bhid,bhjd->bhij", q, k) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("bhij,bhje->bhie", scores.softmax(-1), v)


def diff64(q1, q2, k1, k2, v, lam):
    """Eq. 1 in float64 with the maps formed: (A1 - λ A2) V, one product with the 2d-wide V."""
    q1, q2, k1, k2, v = (t.double() for t in (q1, q2, k1, k2, v))
    n, d = q1.shape[2], q1.shape[-1]
    repeat = q1.shape[1] // k1.shape[1]
    mask = torch.ones(n, n, dtype=torch.bool).triu(1)

    def maps(q, k):
        scores = torch.einsum("bhid,bhjd->bhij", q, k.repeat_interleave(repeat, 1)) / d**0.5
        return scores.masked_fill(mask, float("-inf")).softmax(-1)

    return torch.einsum("bhij,bhje->bhie", maps(q1, k1) - lam * maps(q2, k2), v.repeat_interleave(repeat, 1))


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


@pytest.fixture
def held(monkeypatch) -> list:
    """Record each held call's kernel and shapes; let the CPU's fused (flash) kernel serve it."""
    calls: list = []
    real = sdpa._sdpa

    def record(q, k, v, scale=None):
        calls[-1]["shapes"] = (tuple(q.shape), tuple(k.shape), tuple(v.shape))
        return real(q, k, v, scale)

    def restrict(name):
        calls.append({"kernel": name})
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION])

    monkeypatch.setattr(sdpa, "restrict_sdpa", restrict)
    monkeypatch.setattr(sdpa, "_sdpa", record)
    return calls


def test_auto_on_cuda_chooses_by_dtype_and_width(no_flash):
    for diff in (False, True):
        assert backends.resolve("auto", CUDA, torch.bfloat16, diff=diff, head_dim=64) == "sdpa_flash"
        assert backends.resolve("auto", CUDA, torch.float16, diff=diff, head_dim=256) == "sdpa_flash"
        assert backends.resolve("auto", CUDA, torch.bfloat16, diff=diff, head_dim=512) == "sdpa_efficient"
        assert backends.resolve("auto", CUDA, torch.float32, diff=diff, head_dim=32) == "sdpa_efficient"
        assert backends.resolve("auto", CUDA, torch.float32, diff=diff, head_dim=6) == "sdpa"
        assert backends.resolve("auto", CUDA, torch.bfloat16, diff=diff, head_dim=12) == "sdpa"


def test_flash_attn_stays_first_where_installed(fake_flash):
    assert backends.resolve("auto", CUDA, torch.bfloat16, diff=True, head_dim=64) == "flash_attn"
    assert backends.resolve("auto", CUDA, torch.float32, diff=True, head_dim=64) == "sdpa_efficient"


def test_the_run_records_the_kernel(no_flash):
    module = build("attention", "diff", d_model=256, head_dim=64, layer_idx=0, n_layers=1)
    assert module.resolved_backend(CUDA, torch.bfloat16) == "sdpa_flash"
    assert module.resolved_backend(CUDA, torch.float32) == "sdpa_efficient"


@pytest.mark.parametrize("name", HELD)
@pytest.mark.parametrize("kv_heads", [3, 1])
def test_diff_split_v_on_a_held_kernel(held, name, kv_heads):
    """FlashDiffAttn_2 (Appendix A): two calls, q/k/v all d wide, against Eq. 1 in float64, gradients too."""
    torch.manual_seed(0)
    h, d, n = 3, 8, 11
    q1, q2 = torch.randn(2, h, n, d), torch.randn(2, h, n, d)
    k1, k2 = torch.randn(2, kv_heads, n, d), torch.randn(2, kv_heads, n, d)
    v = torch.randn(2, kv_heads, n, 2 * d)
    lam = torch.tensor(0.3, requires_grad=True)
    leaves = [t.requires_grad_() for t in (q1, q2, k1, k2, v)]
    out = backends.diff_attend(q1, q2, k1, k2, v, lam, backend=name)
    grad_out = torch.randn_like(out)
    got = torch.autograd.grad(out, [*leaves, lam], grad_out)
    wide = [t.detach().double().requires_grad_() for t in leaves]
    lam64 = lam.detach().double().requires_grad_()
    expected = diff64(*wide, lam64)
    want = torch.autograd.grad(expected, [*wide, lam64], grad_out.double())
    assert rel(out, expected) < 1e-5
    for a, b in zip(got, want):
        assert rel(a, b) < 1e-5
    heads = 2 * (h if name != "sdpa_flash" else kv_heads)  # efficient and cuDNN: kv repeated per group
    assert [c["kernel"] for c in held] == [name] * 2
    assert [c["shapes"] for c in held] == [((2, 2 * h, n, d), (2, heads, n, d), (2, heads, n, d))] * 2


@pytest.mark.parametrize("name", HELD)
def test_softmax_on_a_held_kernel(held, name):
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, s, 9, 16, requires_grad=True) for s in (4, 2, 2))
    out = backends.attend(q, k, v, backend=name)
    grad_out = torch.randn_like(out)
    got = torch.autograd.grad(out, [q, k, v], grad_out)
    wide = [t.detach().double().requires_grad_() for t in (q, k, v)]
    expected = causal64(*wide)
    want = torch.autograd.grad(expected, wide, grad_out.double())
    assert rel(out, expected) < 1e-5
    assert all(rel(a, b) < 1e-5 for a, b in zip(got, want))
    assert [c["kernel"] for c in held] == [name]


def test_sdpa_flash_runs_the_cpu_kernel_unaided():
    """No seam: on CPU `sdpa_flash` really holds SDPA to its fused kernel, in a whole diff layer."""
    from torch.profiler import ProfilerActivity, profile

    module = build("attention", "diff", d_model=64, head_dim=8, layer_idx=0, n_layers=1, backend="sdpa_flash")
    x = torch.randn(2, 16, 64, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        module(x).sum().backward()
    ops = {e.key: e.count for e in prof.key_averages() if "scaled_dot_product" in e.key}
    assert ops.get("aten::_scaled_dot_product_flash_attention_for_cpu") == 2, ops
    assert "aten::_scaled_dot_product_attention_math" not in ops


def test_a_kernel_the_device_lacks_is_one_clear_line():
    q = torch.randn(1, 2, 8, 8)
    with pytest.raises(UserError) as e:
        backends.attend(q, q, q, backend="sdpa_efficient")
    assert str(e.value) == (
        "backend: sdpa_efficient has no kernel for cpu float32 heads 8 wide; allowed there: auto, sdpa, math"
    )
