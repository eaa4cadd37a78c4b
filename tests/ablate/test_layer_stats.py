"""Per-layer statistics (`ablate.train.layer_stats`) against RMS values the test computes itself."""

from __future__ import annotations

import math

import pytest
import torch
from mini_project import write_recipe

from ablate.core.workspace import Workspace
from ablate.data import ValBatches, load_tokens
from ablate.model.decoder import build_model
from ablate.recipe.loading import load_recipe
from ablate.store.stores import Stores
from ablate.train.layer_stats import EMBED, attn_out_key, layer_rms, residual_key
from ablate.train.resume import run_dir
from ablate.train.run import train_run

CONFIGS = {
    "softmax": {"attention": {"name": "softmax"}},
    "diff": {"attention": {"name": "diff", "per_head_norm": True}},
}


def _reference_rms(model: torch.nn.Module, tokens: torch.Tensor) -> dict[str, float]:
    """RMS in float64 from outputs captured by this test's own hooks (attention) and by walking the
    residual stream block by block as the model's docstring defines it."""
    captured: dict[int, torch.Tensor] = {}
    handles = [
        block.attention.register_forward_hook(
            lambda m, i, o, layer=layer: captured.__setitem__(layer, o.detach().clone())
        )
        for layer, block in enumerate(model.blocks)
    ]
    try:
        with torch.no_grad():
            x = model.embed(tokens)
            expected = {EMBED: math.sqrt(float((x.double() ** 2).mean()))}
            for layer, block in enumerate(model.blocks):
                y = x + block.attention(block.attn_norm(x))
                x = y + block.ffn(block.ffn_norm(y))
                expected[attn_out_key(layer)] = math.sqrt(float((captured[layer].double() ** 2).mean()))
                expected[residual_key(layer)] = math.sqrt(float((x.double() ** 2).mean()))
    finally:
        for h in handles:
            h.remove()
    return expected


@pytest.mark.parametrize("attention", sorted(CONFIGS))
def test_layer_rms_matches_an_rms_computed_here(attention):
    torch.manual_seed(1)
    config = {"vocab_size": 50, "d_model": 32, "n_layers": 3, "head_dim": 8, **CONFIGS[attention]}
    model = build_model(config, seed=3)
    with torch.no_grad():  # zero-initialised out projections would make every attention output 0
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    tokens = torch.randint(0, 50, (2, 12))
    got = layer_rms(model, tokens)
    expected = _reference_rms(model, tokens)
    assert set(got) == set(expected) and len(got) == 1 + 2 * 3
    for key, value in expected.items():
        assert value > 0
        assert got[key] == pytest.approx(value, rel=1e-6), key
    # no hook is left behind: the training forward stays as it was
    assert all(not m._forward_hooks for m in model.modules())


def test_training_logs_the_final_models_layer_rms_to_mlflow(tmp_path):
    recipe = write_recipe(tmp_path)
    (run,) = load_recipe(recipe, []).resolve(None, seeds=[0], variants=["diff"])
    workspace = tmp_path / "ws"
    result = train_run(run, Stores(workspace), progress=False)
    client = Stores(workspace).client()
    final_step = result.steps
    logged = {}
    for key in [EMBED] + [k(i) for i in range(2) for k in (attn_out_key, residual_key)]:
        history = {m.step: m.value for m in client.get_metric_history(result.run_id, key)}
        assert sorted(history) == [4, 8], key  # at every validation (val_every 4, 8 steps)
        logged[key] = history[final_step]
    # The final validation saw the final weights: rebuild them from the last checkpoint, and take the
    # first held-out micro-batch as the training run did.
    checkpoint = torch.load(
        run_dir(Workspace(workspace), run) / "checkpoints" / "last.ckpt", weights_only=True
    )
    model = build_model(run.config["model"], seed=123)  # different init: the weights must come from the file
    state = {k[len("model.") :]: v for k, v in checkpoint["state_dict"].items() if k.startswith("model.")}
    model.load_state_dict(state)
    model.eval()
    cfg = run.train
    tokens = load_tokens(run.config["data"], Workspace(workspace))
    batch = ValBatches(
        tokens.val, seq_len=cfg.seq_len, micro_batch_size=cfg.micro_batch_size, n_batches=cfg.val_batches
    )[0]
    expected = _reference_rms(model, batch[:, :-1])
    for key, value in expected.items():
        assert logged[key] == pytest.approx(value, rel=1e-5), key
    assert logged[attn_out_key(0)] != logged[attn_out_key(1)]  # per layer, not one number repeated
