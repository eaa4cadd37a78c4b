"""The torch.compile path (`train.compile: true`, `ablate bench --compile`): a compiled model, with the
custom autograd functions (RoPE, RMSNorm) traced and the blockwise core left to run eagerly, computes
what the eager model computes, gradients included."""

from __future__ import annotations

import pytest
import torch

from ablate.model.decoder import build_model


@pytest.mark.parametrize(
    "attention, backend",
    [("diff", "blockwise"), ("diff", "sdpa_padded"), ("diff", "sdpa_flash"), ("softmax", "sdpa")],
)
def test_compiled_model_matches_eager(attention, backend):
    config = {
        "vocab_size": 64,
        "d_model": 32,
        "n_layers": 2,
        "head_dim": 8,
        "attention": {"name": attention},
        "attention_backend": backend,
    }
    eager = build_model(config, seed=0)
    compiled_source = build_model(config, seed=0)
    with torch.no_grad():  # away from the zero-initialised outputs, so every gradient is non-trivial
        for a, b in zip(eager.parameters(), compiled_source.parameters()):
            a.add_(torch.randn_like(a) * 0.05)
            b.copy_(a)
    compiled = torch.compile(compiled_source)
    tokens = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(1))
    for model in (eager, compiled):
        model(tokens).float().logsumexp(-1).mean().backward()
    torch.testing.assert_close(compiled(tokens), eager(tokens), rtol=1e-5, atol=1e-5)
    for (name, a), b in zip(eager.named_parameters(), compiled_source.parameters()):
        assert a.grad is not None and a.grad.abs().sum() > 0, name
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)
