"""DecoderLM: shapes, tied embeddings, and the initialisation its docstring promises (paired seeds)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from ablate.core.errors import UserError
from ablate.model.config import ModelConfig
from ablate.model.decoder import DecoderLM, build_model
from ablate.recipe.loading import load_recipe
from components.attention.diff import DiffAttention
from components.attention.softmax import SoftmaxAttention

TABLE6 = Path(__file__).resolve().parents[2] / "recipes" / "table6.yaml"
LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


@pytest.fixture(scope="module")
def tiny_configs() -> dict[str, dict]:
    """Table 6's seven model configs at the tiny scale (d_model 128, 4 layers, d = 16, vocab 2048)."""
    return {run.variant: run.config["model"] for run in load_recipe(TABLE6).resolve("tiny")}


@pytest.fixture(scope="module")
def tiny_models(tiny_configs) -> dict[str, DecoderLM]:
    """Every Table 6 variant built with seed 0. Tests must not change them."""
    return {name: build_model(config, seed=0) for name, config in tiny_configs.items()}


def tokens(batch: int = 2, n: int = 24, vocab: int = 2048, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, n), generator=torch.Generator().manual_seed(seed))


def residual_names(model: DecoderLM) -> set[str]:
    return {
        name for name, _ in model.named_parameters() if name.endswith(("out_proj.weight", "ffn.w2.weight"))
    }


def is_lambda(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in LAMBDAS


def random_params(model: DecoderLM) -> dict[str, torch.Tensor]:
    """Parameters drawn from a normal at init (not the zero residual outputs, not the norm weights)."""
    zero = residual_names(model)
    return {n: p for n, p in model.named_parameters() if (p.ndim == 2 and n not in zero) or is_lambda(n)}


# --- structure --------------------------------------------------------------------------------------


def test_forward_shapes_and_dtype(tiny_models):
    for name in ("transformer", "diff"):
        logits = tiny_models[name](tokens(3, 17))
        assert logits.shape == (3, 17, 2048), name
        assert logits.dtype == torch.float32
        assert torch.isfinite(logits).all()


def test_blocks_are_built_from_the_recipe(tiny_models):
    transformer, diff = tiny_models["transformer"], tiny_models["diff"]
    assert len(transformer.blocks) == len(diff.blocks) == 4
    assert all(type(b.attention) is SoftmaxAttention for b in transformer.blocks)
    assert all(type(b.attention) is DiffAttention for b in diff.blocks)
    assert (transformer.blocks[0].attention.n_heads, transformer.blocks[0].attention.head_width) == (8, 16)
    assert (
        tiny_models["transformer_d256"].blocks[0].attention.n_heads,
        tiny_models["transformer_d256"].blocks[0].attention.head_width,
    ) == (4, 32)
    assert (diff.blocks[0].attention.n_heads, diff.blocks[0].attention.head_dim) == (4, 16)
    # the block injects layer_idx: exp_depth λ_init differs per layer, constant does not
    assert len({b.attention.lambda_init for b in diff.blocks}) == 4
    assert {b.attention.lambda_init for b in tiny_models["diff_lambda_05"].blocks} == {0.5}
    assert tiny_models["diff_no_gn"].blocks[0].attention.subln is None
    assert diff.blocks[0].attention.subln is not None


def test_logits_are_causal(tiny_configs):
    """Changing a later token must not change earlier logits (with non-zero residuals, so it matters)."""
    for name in ("transformer", "diff"):
        model = build_model({**tiny_configs[name], "zero_init_residual": False}, seed=0)
        x = tokens(1, 20)
        y = x.clone()
        y[0, 12] = (y[0, 12] + 1) % 2048
        with torch.no_grad():
            a, b = model(x), model(y)
        assert torch.equal(a[0, :12], b[0, :12]), name
        assert not torch.allclose(a[0, 12:], b[0, 12:]), name


def test_tied_embeddings_share_storage(tiny_configs):
    untied = build_model(tiny_configs["diff"], seed=0)
    tied = build_model({**tiny_configs["diff"], "tie_embeddings": True}, seed=0)
    assert tied.lm_head.weight is tied.embed.weight
    assert tied.lm_head.weight.data_ptr() == tied.embed.weight.data_ptr()
    with torch.no_grad():
        tied.embed.weight[3, 5] = 7.0
    assert tied.lm_head.weight[3, 5].item() == 7.0
    assert untied.lm_head.weight is not untied.embed.weight
    n_tied = sum(p.numel() for p in tied.parameters())
    n_untied = sum(p.numel() for p in untied.parameters())
    assert n_untied - n_tied == 2048 * 128
    # reset_parameters keeps the tie (it writes in place) and the head sees the embedding's values
    tied.reset_parameters(1)
    assert tied.lm_head.weight is tied.embed.weight
    assert tied.embed.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_meta_build_allocates_nothing(tiny_configs):
    model = build_model(tiny_configs["diff"], device="meta")
    assert all(p.device.type == "meta" for p in model.parameters())


def test_model_config_from_dict_rejects_unknown_keys_and_bad_sizes():
    with pytest.raises(UserError, match="model.d_modle: unknown model key .did you mean 'd_model'"):
        ModelConfig.from_dict({"vocab_size": 8, "d_model": 8, "n_layers": 1, "head_dim": 4, "d_modle": 8})
    with pytest.raises(UserError, match="model.head_dim: 3 does not divide d_model 8"):
        ModelConfig.from_dict({"vocab_size": 8, "d_model": 8, "n_layers": 1, "head_dim": 3})
    with pytest.raises(UserError, match="model.n_layers: expected an integer from 1 to 1,024, got True"):
        ModelConfig.from_dict({"vocab_size": 8, "d_model": 8, "n_layers": True, "head_dim": 4})


# --- initialisation: paired seeds -------------------------------------------------------------------


def test_same_seed_gives_shared_parameters_identical_values_across_variants(tiny_models):
    transformer = dict(tiny_models["transformer"].named_parameters())
    for variant in ("diff", "diff_no_gn", "transformer_d256", "diff_lambda_05"):
        other = dict(tiny_models[variant].named_parameters())
        shared = [n for n in transformer if n in other and other[n].shape == transformer[n].shape]
        expected = {
            "embed.weight",
            "lm_head.weight",
            "final_norm.weight",
            "blocks.0.attn_norm.weight",
            "blocks.3.ffn.w1.weight",
            "blocks.3.ffn.w3.weight",
            "blocks.2.attention.q_proj.weight",
            "blocks.2.attention.k_proj.weight",
            "blocks.2.attention.v_proj.weight",
        }
        assert expected <= set(shared), variant
        for name in shared:
            assert torch.equal(transformer[name], other[name]), f"{variant}: {name}"


def test_same_seed_rebuild_is_identical(tiny_configs, tiny_models):
    again = dict(build_model(tiny_configs["diff"], seed=0).named_parameters())
    for name, param in tiny_models["diff"].named_parameters():
        assert torch.equal(param, again[name]), name


def test_different_seed_gives_different_values(tiny_configs, tiny_models):
    seed1 = dict(build_model(tiny_configs["diff"], seed=1).named_parameters())
    drawn = random_params(tiny_models["diff"])
    assert any(is_lambda(n) for n in drawn) and "embed.weight" in drawn
    for name, param in drawn.items():
        assert not torch.equal(param, seed1[name]), name


def test_each_parameter_name_gets_its_own_draw(tiny_models):
    params = dict(tiny_models["diff"].named_parameters())
    a = "blocks.0.attention."
    assert not torch.equal(params[a + "q_proj.weight"], params[a + "k_proj.weight"])
    assert not torch.equal(params[a + "q_proj.weight"], params["blocks.1.attention.q_proj.weight"])
    assert not torch.equal(params["blocks.0.ffn.w1.weight"], params["blocks.0.ffn.w3.weight"])
    assert not torch.equal(params[a + "lambda_q1"], params[a + "lambda_k1"])
    assert not torch.equal(params[a + "lambda_q1"], params["blocks.1.attention.lambda_q1"])


def test_residual_outputs_are_zero_by_default(tiny_models):
    for variant, model in tiny_models.items():
        names = residual_names(model)
        assert len(names) == 2 * 4, variant
        params = dict(model.named_parameters())
        for name in names:
            assert torch.count_nonzero(params[name]) == 0, f"{variant}: {name}"


def test_every_variant_computes_the_same_function_at_init(tiny_models):
    """Zero residual outputs make every block the identity: identical logits, exactly, for all seven rows."""
    x = tokens(2, 32)
    with torch.no_grad():
        reference = tiny_models["transformer"](x)
        for variant, model in tiny_models.items():
            assert torch.equal(model(x), reference), variant
    assert reference.std().item() > 0


def test_without_zero_init_the_variants_differ(tiny_configs):
    """The equality above is not vacuous: with GPT-2 residual init the blocks do work and the variants differ."""
    models = {
        v: build_model({**tiny_configs[v], "zero_init_residual": False}, seed=0)
        for v in ("transformer", "diff")
    }
    x = tokens(2, 32)
    with torch.no_grad():
        assert not torch.allclose(models["transformer"](x), models["diff"](x))
    for model in models.values():
        for name in residual_names(model):
            std = dict(model.named_parameters())[name].std().item()
            assert std == pytest.approx(0.02 / math.sqrt(2 * 4), rel=0.1), name


def test_lambda_vectors_are_normal_with_std_0_1(tiny_models):
    values = []
    for model in (tiny_models["diff"], tiny_models["diff_no_gn"], tiny_models["diff_lambda_08"]):
        for name, param in model.named_parameters():
            if is_lambda(name):
                assert param.dtype == torch.float32 and param.shape == (16,)
                values.append(param.detach().flatten())
    lam = torch.cat(values)  # 3 models x 4 layers x 4 vectors x 16 (3 x 256 distinct draws)
    assert lam.numel() == 3 * 4 * 4 * 16
    assert lam.std().item() == pytest.approx(0.1, abs=0.015)
    assert abs(lam.mean().item()) < 0.015
    assert lam.abs().max().item() < 0.6  # a normal, not a constant or a uniform over a wide range


def test_lambda_std_option_is_honoured(tiny_configs):
    config = {**tiny_configs["diff"], "attention": {"name": "diff", "lambda_std": 0.3}}
    model = build_model(config, seed=0)
    lam = torch.cat([p.detach() for n, p in model.named_parameters() if is_lambda(n)])
    assert lam.std().item() == pytest.approx(0.3, abs=0.045)


def test_matrices_are_normal_with_init_std(tiny_models, tiny_configs):
    zero = residual_names(tiny_models["diff"])
    matrices = {n: p for n, p in tiny_models["diff"].named_parameters() if p.ndim == 2 and n not in zero}
    assert {
        "embed.weight",
        "lm_head.weight",
        "blocks.0.attention.q_proj.weight",
        "blocks.0.ffn.w1.weight",
    } <= set(matrices)
    for name, param in matrices.items():
        assert param.std().item() == pytest.approx(0.02, rel=0.05), name
        assert abs(param.mean().item()) < 0.002, name
    wide = build_model({**tiny_configs["transformer"], "init_std": 0.05}, seed=0)
    assert wide.embed.weight.std().item() == pytest.approx(0.05, rel=0.05)
    assert wide.blocks[1].attention.v_proj.weight.std().item() == pytest.approx(0.05, rel=0.05)


def test_norm_weights_are_ones(tiny_models):
    for variant in ("diff", "transformer_gn"):
        for name, param in tiny_models[variant].named_parameters():
            if param.ndim == 1 and not is_lambda(name):
                assert torch.equal(param, torch.ones_like(param)), f"{variant}: {name}"
    assert tiny_models["diff"].blocks[0].attention.subln.weight.shape == (32,)
