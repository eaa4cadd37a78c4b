"""`ablate.model.cost`: parameter counts against really built models, FLOPs against FlopCounterMode."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from ablate.model.cost import model_cost, relative_deviation
from ablate.model.decoder import build_model
from ablate.recipe.loading import load_recipe

TABLE6 = Path(__file__).resolve().parents[2] / "recipes" / "table6.yaml"
SEQ = 64


def _tiny(scale: str = "tiny") -> dict[str, dict]:
    return {run.variant: run.config["model"] for run in load_recipe(TABLE6).resolve(scale)}


TINY = _tiny()
EXTRA = {
    "softmax_gqa": {**TINY["transformer"], "attention": {"name": "softmax", "n_kv_heads": 2}},
    "softmax_gqa_d32": {
        **TINY["transformer"],
        "attention": {"name": "softmax", "n_kv_heads": 1, "head_dim_mult": 2},
    },
    "diff_gqa": {**TINY["diff"], "attention": {"name": "diff", "n_kv_heads": 2}},
    "diff_tied": {**TINY["diff"], "tie_embeddings": True},
    "transformer_tied": {**TINY["transformer"], "tie_embeddings": True},
    "gelu_no_rope": {**TINY["transformer"], "ffn": {"name": "gelu"}, "position": "none"},
    "diff_v2": {**TINY["transformer"], "attention": {"name": "diff_v2"}},
    "diff_v2_gqa_half": {
        **TINY["transformer"],
        "attention": {"name": "diff_v2", "heads_mult": 0.5, "n_kv_heads": 2},
    },
}
CONFIGS = {**TINY, **EXTRA}


def counted_flops(config: dict, seq_len: int = SEQ) -> int:
    """Forward FLOPs of the real model as FlopCounterMode counts them (math backend: dense maps)."""
    model = build_model({**config, "attention_backend": "math"}, seed=0)
    x = torch.randint(0, config["vocab_size"], (1, seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops()


def hand_count(
    vocab: int, d: int, layers: int, hidden: int, *, tied: bool = False, per_layer_extra: int = 0
) -> int:
    """LLaMA-style decoder, written from its parts: embedding (+ head), per layer q/k/v/o, SwiGLU, two norms."""
    per_layer = 4 * d * d + 3 * d * hidden + 2 * d + per_layer_extra
    return vocab * d * (1 if tied else 2) + layers * per_layer + d


# --- parameters -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "transformer",
        "diff",
        "transformer_gn",
        "softmax_gqa",
        "diff_gqa",
        "diff_tied",
        "transformer_tied",
        "gelu_no_rope",
    ],
)
def test_params_equal_the_built_model(name):
    config = CONFIGS[name]
    model = build_model(config, seed=0)
    assert model_cost(config, SEQ).params == sum(p.numel() for p in model.parameters())


def test_params_match_a_hand_count():
    hidden = round(128 * 8 / 3)  # 341
    assert model_cost(TINY["transformer"], SEQ).params == hand_count(2048, 128, 4, hidden) == 1_311_360
    # diff adds four λ vectors of width d = 16 and the per-head norm over 2d = 32 channels per layer
    assert model_cost(TINY["diff"], SEQ).params == hand_count(
        2048, 128, 4, hidden, per_layer_extra=4 * 16 + 32
    )
    assert model_cost(TINY["diff_no_gn"], SEQ).params == hand_count(
        2048, 128, 4, hidden, per_layer_extra=4 * 16
    )
    assert model_cost(EXTRA["diff_tied"], SEQ).params == hand_count(
        2048, 128, 4, hidden, tied=True, per_layer_extra=4 * 16 + 32
    )
    # GQA with 2 kv heads of width 16: k and v map 128 -> 32
    gqa = model_cost(EXTRA["softmax_gqa"], SEQ).params
    assert gqa == hand_count(2048, 128, 4, hidden) - 4 * 2 * 128 * (128 - 32)


def test_paper_scale_params_match_a_hand_count():
    """The 1.4B row of Table 10 (vocab 100,288, d_model 2048, 24 layers, FFN 8/3 d_model), counted on meta."""
    paper = _tiny("paper")
    assert (
        model_cost(paper["transformer"], 2048).params == hand_count(100288, 2048, 24, 5461) == 1_618_790_400
    )
    assert model_cost(paper["diff"], 2048).params == hand_count(
        100288, 2048, 24, 5461, per_layer_extra=4 * 128 + 256
    )


@pytest.mark.parametrize("name", ["transformer", "diff", "diff_tied", "transformer_tied", "softmax_gqa"])
def test_non_embedding_params_leave_out_embedding_and_untied_head(name):
    config = CONFIGS[name]
    model = build_model(config, seed=0)
    total = sum(p.numel() for p in model.parameters())
    embedding = model.embed.weight.numel()
    head = 0 if config["tie_embeddings"] else model.lm_head.weight.numel()
    budget = model_cost(config, SEQ)
    assert budget.non_embedding_params == total - embedding - head
    blocks = sum(p.numel() for p in model.blocks.parameters()) + model.final_norm.weight.numel()
    assert budget.non_embedding_params == blocks


# --- FLOPs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_flops_match_flop_counter(name):
    config = CONFIGS[name]
    budget = model_cost(config, SEQ)
    counted = counted_flops(config) / SEQ
    assert budget.fwd_flops_per_token == pytest.approx(counted, rel=0.01)
    assert budget.train_flops_per_token == 3 * budget.fwd_flops_per_token
    assert budget.seq_len == SEQ


def test_flops_grow_with_the_sequence_through_the_attention_maps():
    """Per token, the dense maps cost 2 x 2 x N x d_model per layer more when N grows (FlopCounterMode agrees)."""
    config = TINY["diff"]
    short, long = model_cost(config, 32), model_cost(config, 96)
    per_token_map_cost = 2 * 2 * 128 * 4  # QK^T and AV, per token per unit of N, 4 layers
    assert long.fwd_flops_per_token - short.fwd_flops_per_token == pytest.approx(
        per_token_map_cost * (96 - 32)
    )
    assert long.fwd_flops_per_token == pytest.approx(counted_flops(config, 96) / 96, rel=0.01)


def test_table6_variants_are_matched_at_every_scale():
    for scale in ("tiny", "small", "paper"):
        models = _tiny(scale)
        seq = load_recipe(TABLE6).resolve(scale)[0].config["train"]["seq_len"]
        budgets = {name: model_cost(config, seq) for name, config in models.items()}
        ref = budgets["transformer"]
        for name, b in budgets.items():
            assert abs(relative_deviation(b.params, ref.params)) <= 0.02, (scale, name)
            assert abs(relative_deviation(b.fwd_flops_per_token, ref.fwd_flops_per_token)) <= 0.02, (
                scale,
                name,
            )


def test_built_ins_are_counted_by_hand_and_describe_their_attention():
    from ablate.model.cost import attention_shape

    for name, config in CONFIGS.items():
        assert model_cost(config, SEQ).counted == (), name
    assert attention_shape(TINY["diff_lambda_05"]) == {
        "attention": "diff",
        "heads": "4",
        "d": "16",
        "gn": "yes",
        "lambda_init": "constant 0.5",
    }
    assert attention_shape(CONFIGS["diff_v2"]) == {
        "attention": "diff_v2",
        "heads": "8 (16 q)",
        "d": "16",
        "gn": "no",
        "lambda_init": "sigmoid(λ_proj x)",
    }


def test_relative_deviation():
    assert relative_deviation(102, 100) == pytest.approx(0.02)
    assert relative_deviation(98, 100) == pytest.approx(-0.02)
    assert relative_deviation(5, 0) == 0.0
