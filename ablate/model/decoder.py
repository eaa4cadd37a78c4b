"""`DecoderLM`: a pre-norm decoder assembled from registered components (Section 2.2).

    x = embed(tokens)
    for each layer:  y = x + attention(norm(x));  x = y + ffn(norm(y))
    logits = lm_head(norm(x))

Initialisation (`DecoderLM.reset_parameters(seed)`), written down because paired seeds rely on it:
- every parameter draws from its own generator, seeded by (seed, parameter name). A parameter that two
  variants share by name and shape (embeddings, FFNs, norms, q/k/v projections of equal shape) therefore
  starts identical in both, whatever else differs: seed k pairs the variants.
- matrices (embedding, projections, LM head): Normal(0, init_std), init_std 0.02 (GPT-2 / LLaMA).
- residual output projections a component lists in `residual_out` (attention out_proj, FFN w2): zero
  when `zero_init_residual` (the default), so every block starts as the identity and every variant of a
  recipe computes the same function at step 0 (identical initial loss: a clean paired start);
  otherwise Normal(0, init_std / sqrt(2 n_layers)) (GPT-2). Gradients reach all parameters from the
  second step on.
- vectors (norm weights): ones.
- parameters a component lists in `init_std` (diff attention's λ vectors): Normal(0, that std)
  (reference code: λ vectors Normal(0, 0.1)).
- under `parametrization: mup` the same draws, each std scaled by its μP rule
  (`ablate.model.parametrization`): the generators and the order are those of `standard`.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ablate.core import contract, registry
from ablate.core.errors import UserError
from ablate.model import parametrization as param
from ablate.model.config import ModelConfig


class Block(nn.Module):
    """One pre-norm decoder block: attention and FFN, each behind a norm and a residual."""

    def __init__(
        self,
        config: ModelConfig,
        layer_idx: int,
        make: Mapping[str, Callable[..., nn.Module]],
        mults: param.Multipliers = param.STANDARD,
    ):
        super().__init__()
        self.attn_norm = make["norm"](dim=config.d_model)
        self.attention = make["attention"](
            d_model=config.d_model,
            head_dim=config.head_dim,
            layer_idx=layer_idx,
            n_layers=config.n_layers,
            position=config.position,
            backend=config.attention_backend,
            head_ratio=mults.head_ratio,
        )
        self.ffn_norm = make["norm"](dim=config.d_model)
        self.ffn = make["ffn"](d_model=config.d_model)
        self.branch_mult = mults.branch  # the depth rule's 1 / m_L (ablate.model.parametrization)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.branch_mult != 1.0:
            x = x + self.branch_mult * self.attention(self.attn_norm(x))
            return x + self.branch_mult * self.ffn(self.ffn_norm(x))
        x = x + self.attention(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


def block_makers(config: ModelConfig) -> dict[str, Callable[..., nn.Module]]:
    """The builders of a block's components, each spec checked once (then built for every layer)."""
    return {
        "norm": registry.builder("norm", config.norm, key="model.norm", structure=("dim",)),
        "attention": registry.builder(
            "attention",
            config.attention,
            key="model.attention",
            structure=contract.INJECTED["attention"],
        ),
        "ffn": registry.builder("ffn", config.ffn, key="model.ffn", structure=("d_model",)),
    }


def check_head_ratio(config: ModelConfig, block: Block, mults: param.Multipliers) -> None:
    """μP's 1/d rule reaches the logits through the attention's `head_ratio`: one that does not take it
    cannot be trained at a head width other than the base's."""
    attention = type(block.attention)
    if mults.head_ratio != 1.0 and "head_ratio" not in contract.consumed(attention, "attention"):
        raise UserError(
            f"model.attention: {attention.__qualname__} does not take head_ratio, so its logits cannot "
            f"follow {param.KEY} mup's 1/d rule at head_dim {config.head_dim} (base "
            f"{config.parsed_parametrization.base_head_dim}); accept head_ratio (ablate.core.contract)"
        )


def model_multipliers(config: ModelConfig) -> param.Multipliers:
    """The parametrization's multipliers of a model of `config` (ablate.model.parametrization)."""
    return param.multipliers(
        config.parsed_parametrization,
        d_model=config.d_model,
        head_dim=config.head_dim,
        n_layers=config.n_layers,
    )


class DecoderLM(nn.Module):
    """Embedding, `n_layers` pre-norm blocks, final norm, LM head (tied or untied)."""

    # The model's own parameters' μP roles (ablate.core.contract); the components declare theirs.
    parameter_roles = {"embed.weight": contract.INPUT, "lm_head.weight": contract.OUTPUT}

    def __init__(self, config: ModelConfig | Mapping[str, Any]):
        super().__init__()
        if not isinstance(config, ModelConfig):
            config = ModelConfig.from_dict(config)
        self.config = config
        self.parametrization = config.parsed_parametrization
        mults = model_multipliers(config)
        self.output_mult = mults.output  # μP's 1 / m_N on the LM head's input (ablate.model.parametrization)
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        make = block_makers(config)
        self.blocks = nn.ModuleList(Block(config, i, make, mults) for i in range(config.n_layers))
        check_head_ratio(config, self.blocks[0], mults)
        self.final_norm = make["norm"](dim=config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (batch, seq) -> logits (batch, seq, vocab)."""
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        if self.output_mult != 1.0:
            return self.lm_head(self.final_norm(x) * self.output_mult)
        return self.lm_head(self.final_norm(x))

    def components(self) -> list[tuple[str, nn.Module]]:
        """(path, module) of every registered component the model holds (norms, attentions, FFNs)."""
        parts = [
            (f"blocks.{i}.{name}", getattr(block, name))
            for i, block in enumerate(self.blocks)
            for name in ("attn_norm", "attention", "ffn_norm", "ffn")
        ]
        return parts + [("final_norm", self.final_norm)]

    def flops(self, seq_len: int) -> int:
        """Forward FLOPs for one sequence: what every component reports (or is counted to cost, see
        `ablate.core.contract.component_flops`), plus the LM head."""
        total = 2 * seq_len * self.config.d_model * self.config.vocab_size
        for _, module in self.components():
            total += contract.component_flops(module, seq_len, self.config.d_model)[0]
        return total

    @functools.cached_property
    def mup_basis(self) -> param.Basis:
        """What μP's rules read of this model (mup only): every parameter's role and its shape in the base
        model, built once per model on `meta` (ablate.model.parametrization.basis)."""
        return param.basis(self, self.parametrization)

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """Initialise every parameter as the module docstring says, from `seed`."""
        special: dict[str, float] = {}
        residual: set[str] = set()
        for prefix, module in self.named_modules():
            dot = f"{prefix}." if prefix else ""
            special.update({dot + name: std for name, std in contract.init_std(module).items()})
            residual.update(dot + name for name in contract.residual_out(module))
        std = self.config.init_std
        p = self.parametrization
        scales = (
            {n: r.init for n, r in param.rules(self, self.mup_basis, p, eps=1.0).items()} if p.mup else {}
        )
        depth = p.base_n_layers if p.mup and p.depth == "completep" else self.config.n_layers
        for name, weight in self.named_parameters():
            gen = torch.Generator(device="cpu").manual_seed(_name_seed(seed, name))
            if name in special:
                value = torch.randn(weight.shape, generator=gen) * special[name]
            elif weight.ndim == 1:
                value = torch.ones(weight.shape)
            elif name in residual and self.config.zero_init_residual:
                value = torch.zeros(weight.shape)
            else:
                scale = std / math.sqrt(2 * depth) if name in residual else std
                value = torch.randn(weight.shape, generator=gen) * scale
            if name in scales and scales[name] != 1.0:
                value = value * scales[name]
            weight.copy_(value.to(weight.dtype))


def _name_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def attention_kernel(
    model: DecoderLM | MetaBlocks, device: torch.device, dtype: torch.dtype, seq_len: int | None = None
) -> str:
    """The attention core `model`'s layers run on `device` in `dtype` for sequences `seq_len` long (what `auto`
    resolves to), through the component's `resolved_backend`; an attention that does not say gives its
    configured backend. `model`: built, or its `MetaBlocks` (the first block's attention either way)."""
    attn = model.first.attention if isinstance(model, MetaBlocks) else model.blocks[0].attention
    resolved = getattr(attn, "resolved_backend", None)
    if resolved is None:
        return str(getattr(attn, "backend", model.config.attention_backend))
    return resolved(device, dtype) if seq_len is None else resolved(device, dtype, seq_len=seq_len)


def build_model(
    config: ModelConfig | Mapping[str, Any], *, seed: int = 0, device: str | None = None
) -> DecoderLM:
    """Build and initialise a model. On device 'meta' nothing is allocated or initialised (for budgets)."""
    with torch.device(device or "cpu"):
        model = DecoderLM(config)
    if device != "meta":
        model.reset_parameters(seed)
    return model


@dataclass(frozen=True)
class MetaBlocks:
    """A model's config, first and last blocks and final norm on `meta`: what its cost and shape are read
    from (ablate.model.cost) in the time of two blocks, whatever `n_layers` is."""

    config: ModelConfig
    first: Block
    last: Block
    final_norm: nn.Module


def meta_blocks(config: ModelConfig | Mapping[str, Any]) -> MetaBlocks:
    """`MetaBlocks` of `config`, with the checks a whole model's build makes and no other layer built."""
    if not isinstance(config, ModelConfig):
        config = ModelConfig.from_dict(config)
    make, mults = block_makers(config), model_multipliers(config)
    with torch.device("meta"):
        first = Block(config, 0, make, mults)
        last = Block(config, config.n_layers - 1, make, mults) if config.n_layers > 1 else first
        final_norm = make["norm"](dim=config.d_model)
    check_head_ratio(config, first, mults)
    return MetaBlocks(config, first, last, final_norm)
