"""Position encodings applied to queries and keys inside attention (kind `position`).

The attention module builds one with the width of the vectors it rotates (`head_dim`, the sub-head
width `d` for differential attention) and calls it on tensors of shape (batch, heads, seq, head_dim).
"""

import torch
from torch import nn

from ablate.core.errors import UserError
from ablate.core.registry import register

ROPE_STYLES = ("interleaved", "rotate_half")


@register("position", "rope")
class RoPE(nn.Module):
    """Rotary embeddings, positions 0..N-1; interleaved (GPT-J, the reference's) or rotate_half (NeoX).

    Args:
        theta: the base of the rotation frequencies theta^(-2i/d)
        style: which channels rotate together: interleaved (2i, 2i+1) or rotate_half (i, i + d/2)
    """

    def __init__(self, *, head_dim: int, theta: float = 10000.0, style: str = "interleaved"):
        super().__init__()
        if style not in ROPE_STYLES:
            raise UserError(
                f"model.position.style: unknown RoPE style {style!r}; allowed: {', '.join(ROPE_STYLES)}"
            )
        if head_dim % 2:
            raise UserError(f"model.position: RoPE needs an even head width, got {head_dim}")
        if theta <= 0:
            raise UserError(f"model.position.theta: must be positive, got {theta}")
        self.head_dim, self.theta, self.style = head_dim, float(theta), style
        self._cache: dict[tuple[int, torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def _cos_sin(self, n: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.compiler.is_compiling():  # computed in the graph: the cache's inference check breaks it
            return self._table(n, device, dtype)
        key = (n, device, dtype)
        hit = self._cache.get(key)
        # Tensors made under inference_mode (e.g. Lightning's validation) cannot be saved for backward.
        if hit is None or (hit[0].is_inference() and not torch.is_inference_mode_enabled()):
            self._cache[key] = self._table(n, device, dtype)
        return self._cache[key]

    def _table(self, n: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # Angles in float32 whatever the activation dtype: bf16 positions*frequencies lose whole turns.
        exponent = torch.arange(0, self.head_dim, 2, device=device, dtype=torch.float32) / self.head_dim
        inv_freq = self.theta**-exponent
        angles = torch.outer(torch.arange(n, device=device, dtype=torch.float32), inv_freq)  # (N, hd/2)
        if self.style == "interleaved":  # pair (2i, 2i+1) turns by angle i
            angles = angles.repeat_interleave(2, dim=-1)
        else:  # pair (i, i + hd/2) turns by angle i
            angles = torch.cat([angles, angles], dim=-1)
        # The sine of the first of each pair negated: rotating is x * cos + swap(x) * signed_sin.
        signed_sin = angles.sin()
        if self.style == "interleaved":
            signed_sin.unflatten(-1, (-1, 2))[..., 0].neg_()
        else:
            signed_sin[:, : self.head_dim // 2].neg_()
        return angles.cos().to(dtype), signed_sin.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cos, signed_sin = self._cos_sin(x.shape[-2], x.device, x.dtype)
        return _Rotate.apply(x, cos, signed_sin, self.style)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, theta={self.theta}, style={self.style!r}"


def _swap(x: torch.Tensor, style: str) -> torch.Tensor:
    """Each rotation pair's two members exchanged (a copy): (2i, 2i+1) or (i, i + d/2)."""
    if style == "interleaved":
        return x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    first, second = x.chunk(2, dim=-1)
    return torch.cat([second, first], dim=-1)


class _Rotate(torch.autograd.Function):
    """y = x cos + swap(x) s, with s the sine whose first pair member is negated. A rotation's gradient
    is the opposite rotation, dx = g cos - swap(g) s (swap(s) = -s), so nothing is saved for backward
    and both directions take three passes (autograd's chain of neg, stack, two products and a sum:
    about twice as many)."""

    @staticmethod
    def forward(ctx, x, cos, signed_sin, style):
        ctx.save_for_backward(cos, signed_sin)  # constants of the cache, not activations
        ctx.style = style
        return torch.addcmul(x * cos, _swap(x, style), signed_sin)

    @staticmethod
    def backward(ctx, grad):
        cos, signed_sin = ctx.saved_tensors
        return torch.addcmul(grad * cos, _swap(grad, ctx.style), signed_sin, value=-1), None, None, None


@register("position", "none")
class NoPosition(nn.Module):
    """No position encoding (queries and keys pass unchanged; causal masking alone orders tokens)."""

    def __init__(self):  # explicit: nn.Module's (*args, **kwargs) would make build inject head_dim
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x
