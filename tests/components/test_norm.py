"""The norms against float64 formulas written here: outputs, gradients of input and weight, dtypes."""

import pytest
import torch

from ablate.core.registry import build
from components.norm import rms_norm


def rms_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def layer_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    centred = x - x.mean(-1, keepdim=True)
    return centred / torch.sqrt((centred * centred).mean(-1, keepdim=True) + eps) * weight


@pytest.mark.parametrize("kind, ref", [("rmsnorm", rms_ref), ("layernorm", layer_ref)])
def test_matches_formula_with_gradients(kind, ref):
    torch.manual_seed(0)
    norm = build("norm", {"name": kind, "eps": 1e-5}, dim=24)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.3)
    x, g = torch.randn(3, 5, 24) * 2.0, torch.randn(3, 5, 24)
    x32 = x.clone().requires_grad_()
    (norm(x32) * g).sum().backward()
    x64, w64 = x.double().requires_grad_(), norm.weight.detach().double().requires_grad_()
    expected = ref(x64, w64, 1e-5)
    (expected * g.double()).sum().backward()
    torch.testing.assert_close(norm(x).double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x32.grad.double(), x64.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(norm.weight.grad.double(), w64.grad, rtol=1e-4, atol=1e-5)


def test_rms_norm_factor_and_bf16():
    """The fixed factor scales output and both gradients; a bf16 input stays bf16, its statistics are
    float32 (error of one bf16 rounding, not of a bf16 mean square)."""
    torch.manual_seed(1)
    x, weight, g = torch.randn(4, 7, 16), torch.rand(16) + 0.5, torch.randn(4, 7, 16)
    x64, w64 = x.double().requires_grad_(), weight.double().requires_grad_()
    (rms_ref(x64, w64, 1e-6) * 0.3 * g.double()).sum().backward()
    xs, ws = x.clone().requires_grad_(), weight.clone().requires_grad_()
    out = rms_norm(xs, ws, 1e-6, 0.3)
    (out * g).sum().backward()
    torch.testing.assert_close(out.double(), rms_ref(x.double(), weight.double(), 1e-6) * 0.3)
    torch.testing.assert_close(xs.grad.double(), x64.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ws.grad.double(), w64.grad, rtol=1e-4, atol=1e-5)
    low = rms_norm(x.bfloat16(), weight, 1e-6, 0.3)
    assert low.dtype == torch.bfloat16
    exact = rms_ref(x.bfloat16().double(), weight.double(), 1e-6) * 0.3
    assert ((low.double() - exact).abs() / exact.abs().clamp_min(1e-3)).max() < 2**-7  # one bf16 rounding
