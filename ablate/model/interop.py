"""Loading weights written in the Differential Transformer reference code's layout (docs/paper.md, Section 2.1).

`components.attention.diff.DiffAttention` keeps the reference's parameter names and shapes, so a
reference `MultiheadDiffAttn` / `MultiheadFlashDiff*` state dict loads without conversion; so does
`components.attention.diff_v2.DiffV2Attention` for the authors' Diff V2 (`q_proj, k_proj, v_proj, o_proj,
lambda_proj`). This module checks a state dict and says exactly what does not fit.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ablate.core.errors import UserError


def load_reference_diff_attention(
    state_dict: Mapping[str, torch.Tensor],
    *,
    embed_dim: int,
    num_heads: int,
    num_kv_heads: int | None,
    depth: int,
    backend: str = "math",
):
    """A `DiffAttention` (no position encoding, eval mode) holding a reference-layout state dict.

    `num_heads` is the reference's number of diff heads h (head_dim = embed_dim // num_heads // 2);
    `num_kv_heads` None means as many as `num_heads`; `depth` is the 0-based layer index, giving
    λ_init = 0.8 - 0.6 exp(-0.3 depth). Missing, unexpected or mis-shaped keys are a `UserError`.
    """
    from components.attention.diff import DiffAttention  # the engine names a component only here

    if num_heads < 1 or embed_dim % (2 * num_heads):
        raise UserError(
            f"num_heads: embed_dim {embed_dim} is not divisible by 2 x num_heads = {2 * num_heads}"
        )
    head_dim = embed_dim // num_heads // 2
    module = DiffAttention(
        d_model=embed_dim,
        head_dim=head_dim,
        layer_idx=depth,
        n_layers=depth + 1,
        position="none",
        backend=backend,
        n_kv_heads=num_kv_heads,
        per_head_norm=True,
        lambda_init="exp_depth",
    )
    return _load_checked(
        module,
        state_dict,
        f"reference diff-attention state dict (embed_dim {embed_dim}, num_heads {num_heads}, "
        f"num_kv_heads {num_kv_heads})",
    )


def load_reference_diff_v2_attention(
    state_dict: Mapping[str, torch.Tensor],
    *,
    d_model: int,
    num_heads: int,
    num_kv_heads: int | None,
    head_dim: int,
    backend: str = "math",
):
    """A `DiffV2Attention` (no position encoding, eval mode) holding an authors'-layout Diff V2 state dict.

    `num_heads` is h, the output heads (q_proj has 2h heads of width `head_dim`); `num_kv_heads` None means
    h. Missing, unexpected or mis-shaped keys are a `UserError`.
    """
    from components.attention.diff_v2 import DiffV2Attention  # the engine names a component only here

    if num_heads < 1 or head_dim < 1:
        raise UserError(f"num_heads, head_dim: must be positive, got {num_heads}, {head_dim}")
    module = DiffV2Attention(
        d_model=d_model,
        head_dim=head_dim,
        position="none",
        backend=backend,
        n_kv_heads=num_kv_heads,
        heads_mult=num_heads * head_dim / d_model,
    )
    return _load_checked(
        module,
        state_dict,
        f"reference Diff V2 state dict (d_model {d_model}, num_heads {num_heads}, num_kv_heads {num_kv_heads}, "
        f"head_dim {head_dim})",
    )


def _load_checked(module: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], what: str):
    """`module` with `state_dict` copied in, in eval mode; what does not fit is one `UserError` naming `what`."""
    expected = {name: tuple(t.shape) for name, t in module.state_dict().items()}
    given = {name: tuple(t.shape) for name, t in state_dict.items()}
    problems = []
    if missing := sorted(set(expected) - set(given)):
        problems.append(f"missing {', '.join(missing)}")
    if extra := sorted(set(given) - set(expected)):
        problems.append(f"unexpected {', '.join(extra)}")
    if wrong := [
        f"{n} {given[n]} (expected {expected[n]})"
        for n in sorted(expected)
        if n in given and given[n] != expected[n]
    ]:
        problems.append(f"mis-shaped {', '.join(wrong)}")
    if problems:
        raise UserError(f"{what}: {'; '.join(problems)}")
    with torch.no_grad():
        for name, tensor in module.state_dict().items():
            tensor.copy_(state_dict[name])  # copy_ keeps our dtypes (λ vectors stay float32)
    return module.eval()
