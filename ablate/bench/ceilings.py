"""FLOP ceilings of `ablate bench`: for each variant against the first (the reference), the throughput ratio
expected if time were proportional to the FLOPs of the whole model, for each way a kernel can run
differential attention (an attention module lists them in `kernel_forms`: multipliers of its attention
core, Eq. 1 as written being 1). Given dense (the budget's convention) and causal (masked half skipped)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ablate.model.config import ModelConfig
from ablate.model.decoder import build_model


def flop_ceilings(
    reference: ModelConfig | Mapping[str, Any], variant: ModelConfig | Mapping[str, Any], seq_len: int
) -> dict[str, tuple[float, float]]:
    """{kernel form: (dense, causal)} expected throughput ratio variant / reference if time were
    proportional to the FLOPs executed (whole model, forward; training is 3x both, the ratio is the same)."""
    ref_total, ref_core = _flops_and_core(reference, seq_len)
    total, core = _flops_and_core(variant, seq_len)
    forms = _kernel_forms(variant)
    result = {}
    for form, multiplier in forms.items():
        dense = total + (multiplier - 1) * core
        causal = dense - multiplier * core / 2
        result[form] = (ref_total / dense, (ref_total - ref_core / 2) / causal)
    return result


def _flops_and_core(config: ModelConfig | Mapping[str, Any], n: int) -> tuple[float, float]:
    """Forward FLOPs of one sequence and the part of them in attention maps (the n^2 terms)."""
    model = build_model(config, device="meta")
    core = 0.0
    for block in model.blocks:
        attn = block.attention
        core += (attn.flops(2 * n) - 2 * attn.flops(n)) / 2  # flops(n) = a n + c n^2 -> c n^2
    return float(model.flops(n)), core


def _kernel_forms(config: ModelConfig | Mapping[str, Any]) -> dict[str, float]:
    model = build_model(config, device="meta")
    return dict(getattr(model.blocks[0].attention, "kernel_forms", {"as counted": 1.0}))
