"""Parameters and FLOPs per token of a model, and the matched-budget check between variants.

Counting conventions (say them wherever the numbers are shown):
- parameters: every parameter of the built module, counted on the `meta` device (nothing allocated,
  so a 13B model is counted in milliseconds). "Non-embedding" leaves out the token embedding and an
  untied LM head (Kaplan et al. 2020).
- FLOPs: matrix products only, 2*m*n*k each, as each component reports (`flops(seq_len)`), attention
  maps counted dense (N x N), which is what `torch.utils.flop_counter.FlopCounterMode` counts for the
  math backend. A component without `flops()` is counted by running it under FlopCounterMode on fake
  tensors (`ablate.core.contract.counted_flops`); `Cost.counted` names the kinds counted that way. Differential attention is counted as Eq. 1 reads: two maps, one product
  (A1 - λ A2) V with V of width 2d, so it costs what a Transformer with twice the heads costs; a kernel
  that splits V (Appendix A) executes more, which `ablate bench` reports separately.
- training FLOPs = 3 x forward (backward costs twice the forward).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ablate.core import contract, registry
from ablate.model.config import ModelConfig
from ablate.model.decoder import build_model


@dataclass(frozen=True)
class Cost:
    params: int
    non_embedding_params: int
    fwd_flops_per_token: float
    seq_len: int
    counted: tuple[str, ...] = ()  # component kinds whose FLOPs were counted automatically (no flops())

    @property
    def train_flops_per_token(self) -> float:
        return 3 * self.fwd_flops_per_token


def model_cost(config: ModelConfig | dict, seq_len: int) -> Cost:
    """Count a model's parameters and FLOPs per token at `seq_len` without allocating it."""
    model = build_model(config, device="meta")
    params = sum(p.numel() for p in model.parameters())
    embedding = model.embed.weight.numel()
    if not model.config.tie_embeddings:
        embedding += model.lm_head.weight.numel()
    d_model = model.config.d_model
    flops, counted = 2 * seq_len * d_model * model.config.vocab_size, set()  # LM head
    for path, module in model.components():
        value, how = contract.component_flops(module, seq_len, d_model)
        flops += value
        if how == "counted":
            counted.add(_KIND[path.rsplit(".", 1)[-1]])
    return Cost(
        params=params,
        non_embedding_params=params - embedding,
        fwd_flops_per_token=flops / seq_len,
        seq_len=seq_len,
        counted=tuple(sorted(counted)),
    )


_KIND = {
    "attn_norm": "norm",
    "ffn_norm": "norm",
    "final_norm": "norm",
    "attention": "attention",
    "ffn": "ffn",
}


def attention_shape(model_config: ModelConfig | Mapping[str, Any]) -> dict[str, str]:
    """The attention's name and its own columns (#heads, d, GN, λ_init), read off the built (meta) model
    through the component contract: what `ablate check` prints and runs are tagged with."""
    model = build_model(model_config, device="meta")
    return {
        "attention": registry.spec_name(model.config.attention),
        **contract.attention_columns(model.blocks[0].attention),
    }


def relative_deviation(value: float, reference: float) -> float:
    return (value - reference) / reference if reference else 0.0
