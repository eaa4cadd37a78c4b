"""`outliers` probe: the activation outliers of Table 5.

Over the token budget: top-1/2/3/10/100 and the median of
- |attention logits|: pre-softmax Q K^T / sqrt(d) of every softmax map the attention exposes through
  `attend_with_maps` (softmax: one; Diff: both maps, pooled, as the authors did (their answer in the unilm repository's tracker, #1666); Diff V2:
  every query head), causal entries only (the masked ones never reach a softmax);
- |hidden states|: every element of each block's output, the residual stream after both residual additions;
per layer (`<group>/layer_XX/<stat>`) and over all layers (`<group>/<stat>`). Exact top-k and an exact
median in bounded memory (`order_stats`: the model runs over the tokens twice, once per pass).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ablate.core.registry import register
from ablate.probes.base import Probe
from ablate.probes.capture import block_outputs, causal_entries, route_attention
from ablate.probes.order_stats import AbsOrderStats

TOPS = (1, 2, 3, 10, 100)  # Table 5's columns
GROUPS = ("logits", "hidden")


@register("probe", "outliers")
class ActivationOutliers(Probe):
    """Top-1/2/3/10/100 and median of the absolute attention logits and hidden states, per layer and overall (Table 5)."""

    def __init__(self) -> None:
        self._options: dict = {}

    def run(self, model: nn.Module, batches: Sequence[torch.Tensor]) -> dict[str, float]:
        layers = len(model.blocks)
        stats = {g: [AbsOrderStats(max(TOPS)) for _ in range(layers + 1)] for g in GROUPS}  # last: all layers

        def feed(group: str, layer: int, values: torch.Tensor) -> None:
            stats[group][layer].add(values)
            stats[group][layers].add(values)

        def on_maps(layer: int, maps) -> None:
            for logits in maps.logits:
                feed("logits", layer, causal_entries(logits))

        def on_output(layer: int, hidden: torch.Tensor) -> None:
            feed("hidden", layer, hidden)

        for pass_ in (1, 2):  # pass 2 pins the exact medians (order_stats)
            with (
                torch.inference_mode(),
                route_attention(model, on_maps=on_maps),
                block_outputs(model, on_output),
            ):
                for batch in batches:
                    model(batch[:, :-1])
            if pass_ == 1:
                for per_layer in stats.values():
                    for s in per_layer:
                        s.second_pass()
        results: dict[str, float] = {}
        for group, per_layer in stats.items():
            for layer, s in enumerate(per_layer):
                where = f"{group}/" if layer == layers else f"{group}/layer_{layer:02d}/"
                results.update({f"{where}top{k}": s.top(k) for k in TOPS})
                results[f"{where}median"] = s.median()
        return results
