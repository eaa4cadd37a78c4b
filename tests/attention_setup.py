"""Building an attention component the way a block does, one fp32 forward/backward beside float64 leaf
copies for an independent reference to run on, and the reference's diff-attention parameter layout: shared
by the attention tests in tests/components (pytest puts tests/ on the path, pyproject's `pythonpath`)."""

from __future__ import annotations

import torch

from ablate.core.registry import build


def build_attention(
    spec: dict,
    d_model: int,
    head_dim: int,
    *,
    layer_idx: int,
    n_layers: int,
    position="rope",
    backend="math",
    seed=0,
):
    """The attention `spec` built under `model.attention` with the block's arguments, after seeding torch."""
    torch.manual_seed(seed)
    return build(
        "attention",
        spec,
        key="model.attention",
        d_model=d_model,
        head_dim=head_dim,
        layer_idx=layer_idx,
        n_layers=n_layers,
        position=position,
        backend=backend,
    )


def run_fp32(module, x: torch.Tensor, g: torch.Tensor):
    """module(x) in fp32 with (out * g).sum() backpropagated, and float64 leaf copies of x and of every
    parameter for a reference: (out, x32, x64, params64); x32.grad and each parameter's .grad are filled."""
    x32 = x.clone().requires_grad_()
    out = module(x32)
    (out * g).sum().backward()
    params = {n: t.detach().double().requires_grad_() for n, t in module.named_parameters()}
    return out, x32, x.double().requires_grad_(), params


def reference_diff_shapes(embed_dim: int, kv_rows: int, head_dim: int) -> dict[str, tuple[int, ...]]:
    """The parameter shapes of the reference's MultiheadFlashDiff2 (microsoft/unilm Diff-Transformer): the
    q and out projections embed_dim square, k and v `kv_rows` rows (embed_dim // n_rep), λ's four vectors
    head_dim long, the per-head norm's gain 2 head_dim."""
    return {
        "q_proj.weight": (embed_dim, embed_dim),
        "k_proj.weight": (kv_rows, embed_dim),
        "v_proj.weight": (kv_rows, embed_dim),
        "out_proj.weight": (embed_dim, embed_dim),
        **dict.fromkeys(("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"), (head_dim,)),
        "subln.weight": (2 * head_dim,),
    }
