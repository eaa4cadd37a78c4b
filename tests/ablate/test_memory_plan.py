"""The memory plan (ablate.model.memory) against the real thing: a model's parameters, gradients and AdamW
state after a real step, byte for byte, and one micro-batch's activations against the profiler's peak of a
real forward and backward on this CPU (PyTorch's allocator records), in each precision."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cli_helpers import assert_one_line_error, run_cli

from ablate.core.registry import load_plugins
from ablate.hardware.device import CpuOps
from ablate.hardware.precision import autocast, parameter_dtype
from ablate.model.config import ModelConfig
from ablate.model.decoder import build_model
from ablate.model.memory import memory_plan

SIZES = {  # two sizes: (d_model, n_layers, micro-batch, seq_len, vocab)
    "small": (64, 2, 4, 96, 512),
    "larger": (128, 3, 4, 256, 2048),
}


def _sized(size: str, attention: str) -> tuple[ModelConfig, int, int, int]:
    """A model of one of SIZES with `attention`, and its (micro-batch, seq_len, vocab)."""
    load_plugins()
    d, layers, batch, seq_len, vocab = SIZES[size]
    config = ModelConfig.from_dict(
        {
            "vocab_size": vocab,
            "d_model": d,
            "n_layers": layers,
            "head_dim": 16,
            "attention": {"name": attention},
            "attention_backend": "math",
        }
    )
    return config, batch, seq_len, vocab


def _step(model, tokens, precision):
    with autocast("cpu", precision):
        loss = F.cross_entropy(model(tokens).flatten(0, 1).float(), tokens.flatten())
    loss.backward()


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "bf16-true"])
@pytest.mark.parametrize("attention", ["softmax", "diff", "diff_v2"])
@pytest.mark.parametrize("size", list(SIZES))
def test_the_plan_matches_a_real_step(size, attention, precision):
    config, batch, seq_len, vocab = _sized(size, attention)
    plan = memory_plan(config, precision=precision, micro_batch_size=batch, seq_len=seq_len)
    torch.manual_seed(0)
    model = build_model(config).to(parameter_dtype(precision))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, vocab, (batch, seq_len))
    _step(model, tokens, precision)
    optimizer.step()
    model.zero_grad(set_to_none=False)  # gradients kept: the next step's peak is its activations alone

    def nbytes(tensors):
        return sum(t.numel() * t.element_size() for t in tensors)

    assert plan.params == nbytes(model.parameters())
    assert plan.grads == nbytes(p.grad for p in model.parameters())
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    assert plan.optimizer == nbytes(state)
    peak = CpuOps().peak_bytes(lambda: _step(model, tokens, precision))
    assert plan.activations == pytest.approx(peak, rel=0.10), (plan.activations, peak)


def test_check_prints_the_memory_plan_and_refuses_the_rows_that_do_not_fit(capsys):
    code, out, err = run_cli(capsys, "check", "recipes/table6.yaml", "--scale", "tiny")
    assert code == 0, err
    rows = out[out.index("memory per GPU") :].splitlines()[1:8]
    assert "80 GB card" in out and all("one GPU" in r and "DOES NOT FIT" not in r for r in rows), rows
    code, out, err = run_cli(
        capsys,
        "check",
        "recipes/table6.yaml",
        "--scale",
        "tiny",
        "--base.train.micro_batch_size",
        "4096",
        "--base.train.batch_tokens",
        str(4096 * 4096),
        "--base.train.seq_len",
        "4096",
    )
    assert out.count(": DOES NOT FIT") == 7  # the table printed, then one line
    assert_one_line_error(
        code, err, "table6 tiny row transformer: ", "of an 80 GB card", "(and 6 more rows: "
    )


class _Recomputed(torch.nn.Module):
    """A block whose activations are recomputed in the backward (torch.utils.checkpoint, non-reentrant)."""

    def __init__(self, block: torch.nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
@pytest.mark.parametrize("attention", ["softmax", "diff"])
@pytest.mark.parametrize("size", list(SIZES))
def test_the_checkpointed_plan_matches_a_real_step(size, attention, precision):
    """Activation checkpointing per block: the plan's activations within 25% of the profiler's peak, and
    below the plan that keeps them."""
    config, batch, seq_len, vocab = _sized(size, attention)
    shape = {"precision": precision, "micro_batch_size": batch, "seq_len": seq_len}
    plan = memory_plan(config, activation_checkpointing=True, **shape)
    torch.manual_seed(0)
    model = build_model(config).to(parameter_dtype(precision))
    model.blocks = torch.nn.ModuleList(_Recomputed(block) for block in model.blocks)
    tokens = torch.randint(0, vocab, (batch, seq_len))
    _step(model, tokens, precision)  # gradients allocated: the next step's peak is its activations alone
    peak = CpuOps().peak_bytes(lambda: _step(model, tokens, precision))
    assert plan.activations == pytest.approx(peak, rel=0.25), (plan.activations, peak)
    assert plan.activations < memory_plan(config, **shape).activations
