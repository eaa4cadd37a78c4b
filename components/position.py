"""Position encodings applied to queries and keys inside attention (kind `position`).

The attention module builds one with the width of the vectors it rotates (`head_dim`, the sub-head
width `d` for differential attention) and calls it on tensors of shape (batch, heads, seq, head_dim).
"""

import torch
from torch import nn

from ablate.errors import UserError
from ablate.registry import register

ROPE_STYLES = ("interleaved", "rotate_half")


@register("position", "rope")
class RoPE(nn.Module):
    """Rotary embeddings, positions 0..N-1; interleaved (GPT-J, the reference's) or rotate_half (NeoX)."""

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
        key = (n, device, dtype)
        hit = self._cache.get(key)
        # Tensors made under inference_mode (e.g. Lightning's validation) cannot be saved for backward.
        if hit is None or (hit[0].is_inference() and not torch.is_inference_mode_enabled()):
            # Angles in float32 whatever the activation dtype: bf16 positions*frequencies lose whole turns.
            exponent = torch.arange(0, self.head_dim, 2, device=device, dtype=torch.float32) / self.head_dim
            inv_freq = self.theta**-exponent
            angles = torch.outer(torch.arange(n, device=device, dtype=torch.float32), inv_freq)  # (N, hd/2)
            if self.style == "interleaved":  # pair (2i, 2i+1) turns by angle i
                angles = angles.repeat_interleave(2, dim=-1)
            else:  # pair (i, i + hd/2) turns by angle i
                angles = torch.cat([angles, angles], dim=-1)
            self._cache[key] = (angles.cos().to(dtype), angles.sin().to(dtype))
        return self._cache[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cos, sin = self._cos_sin(x.shape[-2], x.device, x.dtype)
        if self.style == "interleaved":
            pairs = x.unflatten(-1, (-1, 2))
            rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
        else:
            first, second = x.chunk(2, dim=-1)
            rotated = torch.cat([-second, first], dim=-1)
        return x * cos + rotated * sin

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, theta={self.theta}, style={self.style!r}"


@register("position", "none")
class NoPosition(nn.Module):
    """No position encoding (queries and keys pass unchanged; causal masking alone orders tokens)."""

    def __init__(self):  # explicit: nn.Module's (*args, **kwargs) would make build inject head_dim
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x
