"""RoPE (interleaved and rotate_half) against float64 formulas written here, and its relative-position property."""

import pytest
import torch

from ablate.core.errors import UserError
from ablate.core.registry import build


def rotate(x: torch.Tensor, style: str, theta: float) -> torch.Tensor:
    """x (..., N, d) in float64, each rotation pair written out element by element."""
    n, d = x.shape[-2:]
    out = torch.empty_like(x)
    for pos in range(n):
        for i in range(d // 2):
            angle = torch.tensor(pos * theta ** (-2.0 * i / d), dtype=torch.float64)
            a, b = (2 * i, 2 * i + 1) if style == "interleaved" else (i, i + d // 2)
            xa, xb = x[..., pos, a], x[..., pos, b]
            out[..., pos, a] = xa * angle.cos() - xb * angle.sin()
            out[..., pos, b] = xa * angle.sin() + xb * angle.cos()
    return out


@pytest.mark.parametrize("theta", [10000.0, 500.0])
@pytest.mark.parametrize("style", ["interleaved", "rotate_half"])
def test_matches_formula(style, theta):
    rope = build("position", {"name": "rope", "style": style, "theta": theta}, head_dim=8)
    for n in (5, 11, 5):  # new lengths after a cached one
        x = torch.randn(2, 3, n, 8, dtype=torch.float64)
        torch.testing.assert_close(rope(x), rotate(x, style, theta), rtol=1e-6, atol=1e-6)
    x32 = torch.randn(2, 3, 11, 8)
    torch.testing.assert_close(rope(x32), rotate(x32.double(), style, theta).float(), rtol=1e-5, atol=1e-5)


def test_styles_differ():
    torch.manual_seed(0)
    x = torch.randn(1, 1, 6, 8)
    a = build("position", {"name": "rope", "style": "interleaved"}, head_dim=8)(x)
    b = build("position", {"name": "rope", "style": "rotate_half"}, head_dim=8)(x)
    assert not torch.allclose(a, b, atol=1e-3)


@pytest.mark.parametrize("style", ["interleaved", "rotate_half"])
def test_scores_depend_only_on_offset(style):
    torch.manual_seed(0)
    rope = build("position", {"name": "rope", "style": style}, head_dim=16)
    n = 12
    q = rope(torch.randn(16, dtype=torch.float64).expand(1, 1, n, 16))[0, 0]  # one vector at every position
    k = rope(torch.randn(16, dtype=torch.float64).expand(1, 1, n, 16))[0, 0]
    scores = q @ k.T  # scores[m, j] = <R_m q, R_j k>
    for offset in range(-n + 1, n):
        diagonal = torch.diagonal(scores, offset)
        # angles are float32 by design, so ~1e-7 relative, far below an offset's change of score
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(torch.diagonal(scores, 0)[0], torch.diagonal(scores, 3)[0])  # it does rotate
    torch.testing.assert_close(q.norm(dim=-1), q[0].norm().expand(n))  # rotations keep lengths


def test_cache_survives_inference_mode_then_training():
    rope = build("position", "rope", head_dim=8)
    with torch.inference_mode():
        rope(torch.randn(1, 2, 7, 8))
    x = torch.randn(1, 2, 7, 8, requires_grad=True)
    rope(x).sum().backward()  # cos/sin made under inference_mode would refuse to be saved for backward
    assert x.grad is not None


def test_low_precision_uses_float32_angles():
    rope = build("position", "rope", head_dim=8)
    x = torch.randn(1, 1, 2048, 8)
    out = rope(x.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), rope(x), rtol=2e-2, atol=2e-2)


def test_none_is_identity():
    x = torch.randn(2, 3, 5, 8)
    assert build("position", "none", head_dim=8)(x) is x


def test_errors():
    with pytest.raises(
        UserError, match="model.position.style: unknown RoPE style 'gptj'; allowed: interleaved, rotate_half"
    ):
        build("position", {"name": "rope", "style": "gptj"}, key="model.position", head_dim=8)
    with pytest.raises(UserError, match="even head width"):
        build("position", "rope", head_dim=7)


@pytest.mark.parametrize("style", ["interleaved", "rotate_half"])
def test_gradient_matches_formula(style):
    """The rotation's hand-written backward against autograd through the element-wise float64 formula."""
    rope = build("position", {"name": "rope", "style": style}, head_dim=8)
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 8, dtype=torch.float64)
    g = torch.randn(2, 3, 7, 8, dtype=torch.float64)
    x_ours, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    (rope(x_ours) * g).sum().backward()
    (rotate(x_ref, style, 10000.0) * g).sum().backward()
    torch.testing.assert_close(x_ours.grad, x_ref.grad, rtol=1e-6, atol=1e-6)
    # a strided input (a transposed view, as the attention modules pass) rotates the same
    view = x.transpose(1, 2).contiguous().transpose(1, 2)
    torch.testing.assert_close(rope(view), rotate(x, style, 10000.0), rtol=1e-6, atol=1e-6)
