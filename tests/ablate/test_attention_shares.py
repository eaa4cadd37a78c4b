"""Attention to answer and noise (Table 3): shares checked against loops written here, in float64, on a
hand-built map with negative entries and on a model whose maps are known in closed form."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from ablate.analysis import analysable, recorded_maps, row_shares, task_attention_metrics
from ablate.core.contract import AttentionMaps
from ablate.core.registry import register
from ablate.data.tasks.multi_needle import MultiNeedle
from ablate.model.decoder import build_model


def _lam(layer: int, head: int) -> float:
    return 0.2 + 0.1 * layer + 0.15 * head


def known_map(n: int, layer: int, head: int) -> torch.Tensor:
    """U - λ P: U the causal uniform average, P all weight on position 0 (Diff-like, negative entries)."""
    u = torch.tril(torch.ones(n, n)) / torch.arange(1, n + 1)[:, None]
    p = torch.zeros(n, n)
    p[:, 0] = 1.0
    return u - _lam(layer, head) * p


@register("attention", "test_known_maps")
class KnownMaps(nn.Module):
    """Test attention whose effective map is known_map(...) whatever the input; keeps the contract."""

    residual_out = ("out_proj.weight",)

    def __init__(self, *, d_model: int, head_dim: int, layer_idx: int = 0):
        super().__init__()
        self.heads, self.head_dim, self.layer_idx = d_model // head_dim, head_dim, layer_idx
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attend_with_maps(x)[0]

    def attend_with_maps(self, x, *, logit_transform=None):
        b, n, d = x.shape
        e = torch.stack([known_map(n, self.layer_idx, h) for h in range(self.heads)]).expand(b, -1, -1, -1)
        v = self.v_proj(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        out = (e @ v).transpose(1, 2).reshape(b, n, d)
        return self.out_proj(out), AttentionMaps(logits=(), effective=e)


@register("attention", "test_no_maps")
class NoMaps(nn.Module):
    """Test attention without attend_with_maps."""

    def __init__(self, *, d_model: int):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x):
        return self.proj(x)


def _reference_row(
    e: np.ndarray, row: int, span: tuple[int, int], context: tuple[int, int]
) -> tuple[float, float]:
    """Shares of one row of one head, by loops: |mass| on the span and on the rest of the context."""
    total = answer = noise = 0.0
    for j in range(e.shape[-1]):
        mass = abs(float(e[row, j]))
        total += mass
        if span[0] <= j < span[1]:
            answer += mass
        elif context[0] <= j < context[1]:
            noise += mass
    return answer / total, noise / total


def test_row_shares_on_a_hand_built_map_with_negative_entries():
    gen = torch.Generator().manual_seed(1)
    heads, n = 3, 14
    a1 = torch.softmax(
        torch.randn(heads, n, n, generator=gen).masked_fill(~torch.ones(n, n).tril().bool(), -1e9), -1
    )
    a2 = torch.softmax(
        torch.randn(heads, n, n, generator=gen).masked_fill(~torch.ones(n, n).tril().bool(), -1e9), -1
    )
    e = a1 - 0.8 * a2  # Eq. 1 with λ = 0.8: many entries negative
    assert (e < 0).any()
    rows = [9, 11, 13]
    spans = np.array([[2, 5], [6, 9], [2, 5]])
    context = (1, 10)
    answer, noise = row_shares(e.float(), rows, spans, context)
    ref = np.array(
        [
            [_reference_row(e[h].double().numpy(), r, tuple(s), context) for h in range(heads)]
            for r, s in zip(rows, spans)
        ]
    )  # (rows, heads, 2)
    np.testing.assert_allclose(answer.numpy(), ref[:, :, 0].mean(1), rtol=1e-6)
    np.testing.assert_allclose(noise.numpy(), ref[:, :, 1].mean(1), rtol=1e-6)
    # signed mass would differ: the definition is |E|, and it stays in [0, 1]
    assert ((answer >= 0) & (answer + noise <= 1 + 1e-9)).all()


def test_shares_of_a_softmax_map_are_plain_attention_mass():
    a = torch.tensor([[[1.0, 0, 0, 0], [0.5, 0.5, 0, 0], [0.2, 0.3, 0.5, 0], [0.1, 0.2, 0.3, 0.4]]])
    answer, noise = row_shares(a, [3], np.array([[1, 2]]), (1, 3))
    assert answer.item() == pytest.approx(0.2) and noise.item() == pytest.approx(0.3)


def _model(attention: str, layers: int = 2):
    return build_model(
        {
            "vocab_size": 256,
            "d_model": 16,
            "n_layers": layers,
            "head_dim": 8,
            "attention": {"name": attention},
        },
        seed=0,
    )


def test_recorded_maps_reads_every_layer_and_leaves_the_output_alone():
    model = _model("test_known_maps", layers=3)
    tokens = torch.randint(0, 256, (2, 10), generator=torch.Generator().manual_seed(0))
    plain = model(tokens)
    with recorded_maps(model) as maps:
        recorded = model(tokens)
    assert torch.equal(plain, recorded) and len(maps) == 3
    for layer, m in enumerate(maps):
        assert torch.equal(m[1, 1], known_map(10, layer, 1))
    assert all("forward" not in vars(block.attention) for block in model.blocks)  # restored
    assert analysable(model) and not analysable(_model("test_no_maps"))
    assert task_attention_metrics(_model("test_no_maps"), MultiNeedle(lengths=[64])) == {}


def test_task_shares_on_a_model_with_known_maps():
    model = _model("test_known_maps", layers=2)
    task = MultiNeedle(levels=[[1, 1], [3, 2]], depths=[0, 50, 100], lengths=[64, 96])
    metrics = task_attention_metrics(model, task, per_cell=2, batch_size=3)
    # Closed form per row r (0-based): |E_rj| = 1/(r+1) for 1 <= j <= r, |1/(r+1) - λ| at j = 0.
    per_depth: dict[int, list[tuple[float, float]]] = {}
    for i in range(2 * len(task.cells())):
        s = task.held_out_sample(i)
        answers, noises = [], []
        for p, (a, b) in zip(s.answer_positions, s.answer_spans):
            r = int(p) - 1
            for layer in range(2):
                for head in range(2):
                    total = r / (r + 1) + abs(1 / (r + 1) - _lam(layer, head))
                    in_span = len(range(max(a, 1), min(b, r + 1)))
                    in_context = len(range(max(s.context[0], 1), min(s.context[1], r + 1)))
                    answers.append(in_span / (r + 1) / total)
                    noises.append((in_context - in_span) / (r + 1) / total)
        per_depth.setdefault(s.tags["depth"], []).append((np.mean(answers), np.mean(noises)))
    for depth, values in per_depth.items():
        assert metrics[f"attn/answer_share/depth_{depth}"] == pytest.approx(
            np.mean([a for a, _ in values]), rel=1e-6
        )
        assert metrics[f"attn/noise_share/depth_{depth}"] == pytest.approx(
            np.mean([n for _, n in values]), rel=1e-6
        )
    everything = [v for values in per_depth.values() for v in values]
    assert metrics["attn/answer_share"] == pytest.approx(np.mean([a for a, _ in everything]), rel=1e-6)
    assert metrics["attn/answer_share/level_N3R2"] > 0
