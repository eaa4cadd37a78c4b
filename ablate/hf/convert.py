"""A `DecoderLM`'s weights in the layout of a built-in `transformers` class: `LlamaForCausalLM` or
`DiffLlamaForCausalLM`, or `None` with the reason (then the export takes the custom-code path).

What maps, and how (each step checked by tests/ablate/test_hf_export.py against the model's own logits):
- the Transformer (softmax attention, no per-head norm; RMSNorm everywhere with one eps; SwiGLU; RoPE) is
  Llama: w1, w3, w2 -> gate_proj, up_proj, down_proj;
- Diff V1 with its per-head norm and λ_init = 0.8 - 0.6 exp(-0.3 l) (Eq. 2, 0-based l: DiffLlama's
  `lambda_init_fn`) is DiffLlama: q/k sub-heads reordered (sub-head 2i + c of head i -> c h + i, Q1 of every
  head first, then every Q2: DiffLlama's two chunks), V heads of width 2d split in halves (half c of kv head m
  -> c h_kv + m), and the per-head norm's gain folded into `o_proj`'s columns (DiffLlama's norm has no gain;
  Eq. 3's (1 - λ_init) it applies itself). λ is Eq. 2 in both, exp(λq1·λk1) - exp(λq2·λk2) + λ_init;
- RoPE: ablate's default `interleaved` pairs channels (2i, 2i+1) where transformers' `rotate_half` pairs
  (i, i + d/2), both at frequency i: the q and k rows of every (sub-)head are permuted, new i <- 2i and
  new i + d/2 <- 2i + 1, which leaves every q·k (and so every logit) as it was;
- μP's multipliers are folded into weights (ablate.model.parametrization): the queries' head_ratio^-1/2 into
  q_proj (RoPE is linear), λ's 1/head_ratio into λq1 and λq2, the depth rule's branch multiplier into
  o_proj and down_proj, the output multiplier into an untied lm_head.

Anything else (Diff V2, LayerNorm, GELU, no position encoding, constant λ_init, a per-head norm on softmax
attention, a plugin's component) has no built-in class and goes through `ablate.hf.remote`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ablate.model.decoder import DecoderLM


@dataclass(frozen=True)
class Mapped:
    """A built-in class's name, its config keywords and its state dict."""

    architecture: str  # LlamaForCausalLM | DiffLlamaForCausalLM
    config: dict[str, Any]
    state_dict: dict[str, torch.Tensor]


def to_builtin(model: DecoderLM, *, max_positions: int) -> Mapped | str:
    """`model` as Llama or DiffLlama (module docstring), or the reason it is neither."""
    from components.attention.diff import DiffAttention
    from components.attention.softmax import SoftmaxAttention

    reason = _common_reason(model)
    if reason:
        return reason
    attn = model.blocks[0].attention
    if type(attn) is SoftmaxAttention:
        if attn.subln is not None:
            return "softmax attention with a per-head norm has no transformers class"
        return _llama(model, max_positions)
    if type(attn) is DiffAttention:
        if attn.subln is None:
            return "diff attention without its per-head norm has no transformers class"
        if attn.subln.eps != model.final_norm.eps:
            return f"the per-head norm's eps {attn.subln.eps:g} differs from the model's {model.final_norm.eps:g}"
        for i, block in enumerate(model.blocks):
            expected = 0.8 - 0.6 * math.exp(-0.3 * i)  # DiffLlama's lambda_init_fn (Eq. 2)
            if abs(block.attention.lambda_init - expected) > 1e-12:
                return f"λ_init {block.attention.lambda_rule} is not DiffLlama's 0.8 - 0.6 exp(-0.3 l)"
        return _diffllama(model, max_positions)
    return f"attention {type(attn).__qualname__} has no transformers class"


def _common_reason(model: DecoderLM) -> str | None:
    """What keeps `model` out of both built-in classes whatever its attention, or None."""
    from components.ffn import SwiGLU
    from components.norm import RMSNorm
    from components.position import RoPE

    attentions = {type(b.attention) for b in model.blocks}
    if len(attentions) != 1:
        return "its layers hold different attentions"
    parts = [model.final_norm] + [m for b in model.blocks for m in (b.attn_norm, b.ffn_norm, b.ffn)]
    if other := sorted({type(m).__qualname__ for m in parts if type(m) not in (RMSNorm, SwiGLU)}):
        return f"{', '.join(other)} has no transformers class (Llama's are RMSNorm and SwiGLU)"
    if len({m.eps for m in parts if type(m) is RMSNorm}) > 1:
        return "its norms have different eps"
    position = model.blocks[0].attention.position
    if type(position) is not RoPE:
        return f"position {type(position).__qualname__} has no transformers class (Llama's is RoPE)"
    if model.config.tie_embeddings and model.output_mult != 1.0:
        return "a tied LM head with μP's output multiplier cannot be folded into one matrix"
    return None


def _shared(model: DecoderLM, max_positions: int, heads: int, kv_heads: int, width: int) -> dict[str, Any]:
    cfg = model.config
    ffn = model.blocks[0].ffn
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": ffn.hidden,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": width,
        "hidden_act": "silu",
        "max_position_embeddings": max_positions,
        "rms_norm_eps": model.final_norm.eps,
        "rope_theta": model.blocks[0].attention.position.theta,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "pad_token_id": None,
    }


def _rope_rows(weight: torch.Tensor, heads: int, width: int, style: str) -> torch.Tensor:
    """The rows of a q or k projection, (heads x width, d_model), in rotate_half's channel order."""
    if style == "rotate_half":
        return weight
    order = torch.cat(
        [torch.arange(0, width, 2), torch.arange(1, width, 2)]
    )  # new i <- 2i, i + w/2 <- 2i + 1
    return weight.view(heads, width, -1)[:, order].reshape(weight.shape)


def _outer(model: DecoderLM) -> dict[str, torch.Tensor]:
    sd = {
        "model.embed_tokens.weight": model.embed.weight,
        "model.norm.weight": model.final_norm.weight,
    }
    if not model.config.tie_embeddings:
        sd["lm_head.weight"] = model.lm_head.weight * model.output_mult
    return sd


def _block(prefix: str, block: Any) -> dict[str, torch.Tensor]:
    ffn = block.ffn
    return {
        f"{prefix}.input_layernorm.weight": block.attn_norm.weight,
        f"{prefix}.post_attention_layernorm.weight": block.ffn_norm.weight,
        f"{prefix}.mlp.gate_proj.weight": ffn.w1.weight,
        f"{prefix}.mlp.up_proj.weight": ffn.w3.weight,
        f"{prefix}.mlp.down_proj.weight": ffn.w2.weight * block.branch_mult,
    }


@torch.no_grad()
def _state(
    model: DecoderLM, attention: Callable[[Any, float], dict[str, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    """The Hugging Face state dict, each tensor a copy: the outer weights, then each layer's norms and MLP
    and, under its `self_attn.`, what `attention(the block's attention, its branch multiplier)` maps (no
    gradient recorded)."""
    sd = _outer(model)
    for i, block in enumerate(model.blocks):
        p = f"model.layers.{i}"
        sd |= _block(p, block)
        rows = attention(block.attention, block.branch_mult)
        sd |= {f"{p}.self_attn.{name}": weight for name, weight in rows.items()}
    return {k: v.detach().clone() for k, v in sd.items()}


def _llama(model: DecoderLM, max_positions: int) -> Mapped:
    attn = model.blocks[0].attention
    heads, kv, width = attn.n_heads, attn.n_kv_heads, attn.head_width
    style = attn.position.style

    def rows(a: Any, branch_mult: float) -> dict[str, torch.Tensor]:
        return {
            "q_proj.weight": _rope_rows(a.q_proj.weight * a.q_scale, heads, width, style),
            "k_proj.weight": _rope_rows(a.k_proj.weight, kv, width, style),
            "v_proj.weight": a.v_proj.weight,
            "o_proj.weight": a.out_proj.weight * branch_mult,
        }

    config = _shared(model, max_positions, heads, kv, width)
    return Mapped("LlamaForCausalLM", config, _state(model, rows))


def _diffllama(model: DecoderLM, max_positions: int) -> Mapped:
    attn = model.blocks[0].attention
    d, h, h_kv = attn.head_dim, attn.n_heads, attn.n_kv_heads
    style = attn.position.style

    def rows(a: Any, branch_mult: float) -> dict[str, torch.Tensor]:
        q = _rope_rows(a.q_proj.weight * a.q_scale, 2 * h, d, style).view(h, 2, d, -1)
        k = _rope_rows(a.k_proj.weight, 2 * h_kv, d, style).view(h_kv, 2, d, -1)
        v = a.v_proj.weight.view(h_kv, 2, d, -1)  # kv head m's 2d rows: half 0, then half 1
        gain = a.subln.weight.float().repeat(h)  # Eq. 3's gain over every head's 2d channels
        # sub-head 2i + c -> c h + i (and the same for k and V's halves): transpose (head, c) to (c, head)
        return {
            "q_proj.weight": q.transpose(0, 1).reshape(2 * h * d, -1),
            "k_proj.weight": k.transpose(0, 1).reshape(2 * h_kv * d, -1),
            "v_proj.weight": v.transpose(0, 1).reshape(2 * h_kv * d, -1),
            "o_proj.weight": a.out_proj.weight * gain * branch_mult,
            "lambda_q1": a.lambda_q1 * a.lambda_dot_scale,
            "lambda_k1": a.lambda_k1,
            "lambda_q2": a.lambda_q2 * a.lambda_dot_scale,
            "lambda_k2": a.lambda_k2,
        }

    config = _shared(model, max_positions, 2 * h, 2 * h_kv, d) | {"lambda_std_dev": attn.lambda_std}
    return Mapped("DiffLlamaForCausalLM", config, _state(model, rows))
