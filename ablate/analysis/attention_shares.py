"""Attention to the answer and to noise (Table 3), read through the component contract.

Definition (the paper gives none; this is ablate's). For one layer, one head, one query row i (a position
that produces an answer token: the token before it), with E the head's effective map (`AttentionMaps.
effective`: softmax A; Diff A1 - λ A2; Diff V2 its own combination), and the answer needle's span S inside
the context C:

    answer share(i) = Σ_{j ∈ S} |E_ij| / Σ_j |E_ij|
    noise share(i)  = Σ_{j ∈ C \\ S} |E_ij| / Σ_j |E_ij|

averaged over heads, then layers, then the sample's answer rows, then samples (of one depth). Why absolute
mass: for softmax it is the ordinary share (A ≥ 0, rows sum to 1); for differential attention the row's
signed total is about 1 - λ and can be near zero or negative, so signed shares would divide by an unstable
number, while |E| is what the output actually mixes in, whatever its sign: noise that A1 - λ A2 cancels
shows up as little absolute mass on it. The two shares need not add to 1: the rest is on the sample's
start and its query tokens, as in the paper (answer 0.03-0.09 + noise 0.49-0.54 for the Transformer).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ablate.core.contract import AnalysableAttention


@contextlib.contextmanager
def recorded_maps(
    model: nn.Module, select: Callable[[torch.Tensor], Any] | None = None
) -> Iterator[list[Any]]:
    """While open, every attention module of `model` that keeps the contract runs `attend_with_maps`
    instead of `forward` (same output) and appends its effective map (B, H, N, N) to the yielded list, in
    call order (layer 0 first); or `select(map)`, so a caller keeps only the rows it needs instead of every
    layer's N x N maps. Modules are found by the contract, not by class: plugins take part."""
    records: list[Any] = []
    keep = select or (lambda e: e.detach())
    patched = [m for m in model.modules() if m is not model and isinstance(m, AnalysableAttention)]

    def forward_of(module: nn.Module):
        def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            out, maps = module.attend_with_maps(x)
            records.append(keep(maps.effective))
            return out

        return forward

    for module in patched:
        module.forward = forward_of(module)  # an instance attribute shadows the class's forward
    try:
        yield records
    finally:
        for module in patched:
            del module.forward


def analysable(model: nn.Module) -> bool:
    """True when the model has attention modules and every one keeps the analysis contract."""
    attentions = [m for name, m in model.named_modules() if name.endswith("attention")]
    return bool(attentions) and all(isinstance(m, AnalysableAttention) for m in attentions)


def row_shares(
    effective: torch.Tensor, rows: Sequence[int], spans: np.ndarray, context: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sample, one layer: effective (H, N, N); `rows` the query positions, `spans` (len(rows), 2) the
    answer span of each row. Returns (answer, noise) shares per row, averaged over heads (float64)."""
    e = effective.detach().double().abs()[:, list(rows), :]  # (H, R, N)
    n = e.shape[-1]
    keys = torch.arange(n)
    spans_t = torch.as_tensor(np.asarray(spans), dtype=torch.long)
    in_span = (keys[None, :] >= spans_t[:, :1]) & (keys[None, :] < spans_t[:, 1:])  # (R, N)
    in_context = (keys >= context[0]) & (keys < context[1])
    noise = in_context[None, :] & ~in_span
    total = e.sum(-1).clamp_min(torch.finfo(torch.float64).tiny)
    answer_share = (e * in_span).sum(-1) / total
    noise_share = (e * noise).sum(-1) / total
    return answer_share.mean(0), noise_share.mean(0)


def sample_shares(
    maps: Sequence[torch.Tensor], answer_spans: np.ndarray, context: tuple[int, int]
) -> tuple[float, float]:
    """One sample: `maps` holds, per layer, its (H, R, N) rows of the effective map at the positions that
    produce its R answer tokens (row p - 1 produces answer token p). Returns (answer, noise) averaged over
    layers, heads and rows."""
    rows = range(len(answer_spans))
    per_layer = [row_shares(m, rows, answer_spans, context) for m in maps]
    answer = torch.stack([a for a, _ in per_layer]).mean(0).mean()
    noise = torch.stack([n for _, n in per_layer]).mean(0).mean()
    return float(answer), float(noise)
