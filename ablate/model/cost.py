"""Parameters and FLOPs per token of a model, and the matched-budget check between variants.

Counting conventions (say them wherever the numbers are shown):
- parameters: every parameter of the model, counted on the `meta` device (nothing allocated) as one
  block's times `n_layers` plus the embedding, final norm and LM head, so a 13B model is counted in
  milliseconds and a model of any depth in the time of two blocks. "Non-embedding" leaves out the token embedding and an
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

from torch import nn

from ablate.core import contract, registry
from ablate.core.errors import UserError
from ablate.model.config import ModelConfig
from ablate.model.decoder import MetaBlocks, meta_blocks


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


def model_cost(config: ModelConfig | dict | MetaBlocks, seq_len: int) -> Cost:
    """Count a model's parameters and FLOPs per token at `seq_len` without allocating it: one block's,
    times `n_layers`, plus the embedding, final norm and LM head. A model's blocks differ only in values
    (λ_init by depth), not in shapes: the last block is built too, and one that differs from the first
    in parameters or FLOPs is refused in one line naming the component."""
    parts = _meta(config)
    cfg = parts.config
    first, first_counted = _block_cost(parts.first, seq_len, cfg.d_model)
    last, _ = _block_cost(parts.last, seq_len, cfg.d_model)
    if last != first:
        differs = next(name for name in _KIND if name in first and first[name] != last[name])
        raise UserError(
            f"model.{_KIND[differs]}: layer 0 and layer {cfg.n_layers - 1} differ in (parameters, FLOPs): "
            f"{first[differs]} against {last[differs]}; a model's cost is one block's times n_layers, "
            "so its blocks must match in shape"
        )
    block_params = sum(p for p, _ in first.values())
    block_flops = sum(f for _, f in first.values())
    embedding = cfg.vocab_size * cfg.d_model * (1 if cfg.tie_embeddings else 2)
    norm_params = sum(p.numel() for p in parts.final_norm.parameters())
    norm_flops, how = contract.component_flops(parts.final_norm, seq_len, cfg.d_model)
    counted = first_counted | ({"norm"} if how == "counted" else set())
    params = cfg.n_layers * block_params + embedding + norm_params
    flops = 2 * seq_len * cfg.d_model * cfg.vocab_size + cfg.n_layers * block_flops + norm_flops  # LM head
    return Cost(
        params=params,
        non_embedding_params=params - embedding,
        fwd_flops_per_token=flops / seq_len,
        seq_len=seq_len,
        counted=tuple(sorted(counted)),
    )


def _block_cost(
    block: nn.Module, seq_len: int, d_model: int
) -> tuple[dict[str, tuple[int, float]], set[str]]:
    """{component name: (parameters, forward FLOPs at seq_len)} of one block (a `Block` holds no parameter
    of its own), and the kinds whose FLOPs were counted automatically."""
    out, counted = {}, set()
    for name in ("attn_norm", "attention", "ffn_norm", "ffn"):
        module = getattr(block, name)
        value, how = contract.component_flops(module, seq_len, d_model)
        out[name] = (sum(p.numel() for p in module.parameters()), value)
        if how == "counted":
            counted.add(_KIND[name])
    return out, counted


_KIND = {
    "attn_norm": "norm",
    "ffn_norm": "norm",
    "final_norm": "norm",
    "attention": "attention",
    "ffn": "ffn",
}


def attention_shape(model_config: ModelConfig | Mapping[str, Any] | MetaBlocks) -> dict[str, str]:
    """The attention's name and its own columns (#heads, d, GN, λ_init), read off its first block built on
    `meta` through the component contract: what `ablate check` prints and runs are tagged with."""
    parts = _meta(model_config)
    return {
        "attention": registry.spec_name(parts.config.attention),
        **contract.attention_columns(parts.first.attention),
    }


def _meta(config: ModelConfig | Mapping[str, Any] | MetaBlocks) -> MetaBlocks:
    """`config`'s blocks on `meta`, or the ones given: a caller that reads a model's cost, shape and kernel
    (a run's tags, ablate.train.records) builds them once."""
    return config if isinstance(config, MetaBlocks) else meta_blocks(config)


def relative_deviation(value: float, reference: float) -> float:
    return (value - reference) / reference if reference else 0.0
