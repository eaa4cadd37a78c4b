"""Probes (kind `probe`): order statistics, the outlier probe, the logit quantizer and the quantization probe,
each against a computation written here (numpy, forward hooks of the test's own, hand-computed values)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ablate.core import registry
from ablate.core.contract import causal_mask
from ablate.core.errors import UserError
from ablate.model.decoder import build_model
from ablate.probes import ActivationOutliers, LogitQuantization, absmax_quantize, route_attention
from ablate.probes.order_stats import AbsOrderStats
from ablate.probes.outliers import TOPS


def _feed_twice(stats: AbsOrderStats, tensors: list[torch.Tensor]) -> None:
    for t in tensors:
        stats.add(t)
    stats.second_pass()
    for t in tensors:
        stats.add(t)


def _numpy_top_and_median(tensors: list[torch.Tensor]) -> tuple[np.ndarray, float]:
    values = np.abs(np.concatenate([t.double().numpy().ravel() for t in tensors]))
    return np.sort(values)[::-1], float(np.median(values))


@pytest.mark.parametrize("extra", [0, 1])  # an even and an odd number of values
def test_top_k_and_median_match_numpy_on_a_hand_built_set(extra):
    torch.manual_seed(0)
    tensors = [
        torch.tensor([[3.0, -3.0], [0.5, -1e-8]]),  # ties in |x| and a tiny value
        torch.zeros(5),  # zeros: the bottom of the order
        torch.randn(3, 4, 7) * 50,  # spans many exponent buckets
        torch.tensor([1.0000001, 1.0000002, -1.0000001]),  # same upper 16 bits: pass 2 must separate them
        torch.randn(1000).exp(),  # the bulk, lognormal
        torch.tensor([-250.5]),
    ] + [torch.tensor([0.75])] * extra
    stats = AbsOrderStats(k=100)
    _feed_twice(stats, tensors)
    ordered, median = _numpy_top_and_median(tensors)
    assert stats.count == ordered.size
    for k in (1, 2, 3, 10, 100):
        assert stats.top(k) == pytest.approx(float(np.float32(ordered[k - 1])), rel=0, abs=0)
    assert stats.top(1) == 250.5
    assert stats.median() == median  # numpy's median of the same float32 values, in float64


def test_median_in_one_bucket_and_across_buckets():
    """Middle values that share their upper 16 bits, and an even count whose two middles differ in bucket."""
    close = torch.tensor([1.0, 1.0 + 2**-23, 1.0 + 2**-22, 1.0 + 3 * 2**-23])  # four adjacent float32s
    stats = AbsOrderStats()
    _feed_twice(stats, [close])
    assert stats.median() == (1.0 + 2**-23 + 1.0 + 2**-22) / 2
    apart = [torch.tensor([1.0, 2.0]), torch.tensor([1000.0, 0.001])]
    stats = AbsOrderStats()
    _feed_twice(stats, apart)
    assert stats.median() == (float(torch.tensor(1.0)) + 2.0) / 2 and stats.top(1) == 1000.0
    assert math.isnan(stats.top(10))  # fewer values than k: no such statistic


def test_median_without_second_pass_or_with_other_data_is_refused():
    stats = AbsOrderStats()
    stats.add(torch.ones(4))
    with pytest.raises(RuntimeError, match="second pass"):
        stats.median()
    stats.second_pass()
    stats.add(torch.ones(3))
    with pytest.raises(RuntimeError, match="not the same data"):
        stats.median()


def _model(attention: str, *, layers: int = 2, backend: str = "math", seed: int = 0) -> nn.Module:
    config = {
        "vocab_size": 61,
        "d_model": 32,
        "n_layers": layers,
        "head_dim": 8,
        "attention": attention,
        "attention_backend": backend,
        "zero_init_residual": False,
    }
    model = build_model(config, seed=seed).eval()
    with torch.no_grad():  # larger weights: logits and hidden states with a spread of magnitudes
        for name, p in model.named_parameters():
            if p.ndim == 2 and "embed" not in name:
                p.mul_(8.0)
    return model


def _batches(seed: int = 1, n: int = 3, batch: int = 2, seq: int = 12) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 61, (batch, seq + 1), generator=g) for _ in range(n)]


@pytest.mark.parametrize("attention", ["softmax", "diff"])
def test_outliers_probe_matches_hooks_written_here(attention):
    model, batches = _model(attention), _batches()
    results = ActivationOutliers().run(model, batches)

    layers = len(model.blocks)
    logits: list[list[torch.Tensor]] = [[] for _ in range(layers)]
    hidden: list[list[torch.Tensor]] = [[] for _ in range(layers)]
    handles = []
    for i, block in enumerate(model.blocks):

        def on_block(module, args, output, i=i):
            hidden[i].append(output.detach().clone())

        def on_attention(module, args, output, i=i):  # the attention's input: recompute its maps from it
            n = args[0].shape[1]
            for t in module.attend_with_maps(args[0])[1].logits:
                logits[i].append(t[..., causal_mask(n)].detach().clone())

        handles += [
            block.register_forward_hook(on_block),
            block.attention.register_forward_hook(on_attention),
        ]
    with torch.no_grad():
        for batch in batches:
            model(batch[:, :-1])
    for h in handles:
        h.remove()
    assert len(logits[0]) == len(batches) * (2 if attention == "diff" else 1)  # diff: both maps

    for group, captured in (("logits", logits), ("hidden", hidden)):
        for where, tensors in [(f"{group}/layer_{i:02d}/", captured[i]) for i in range(layers)] + [
            (f"{group}/", [t for per_layer in captured for t in per_layer])
        ]:
            ordered, median = _numpy_top_and_median(tensors)
            for k in TOPS:
                assert results[f"{where}top{k}"] == float(np.float32(ordered[k - 1])), (where, k)
            assert results[f"{where}median"] == pytest.approx(median, rel=1e-12, abs=0), where
    assert results["hidden/top1"] > results["hidden/median"] > 0
    for block in model.blocks:  # the routing undid itself
        assert "forward" not in block.attention.__dict__ and not block._forward_hooks


def test_routing_restores_forward_after_an_error_and_refuses_unanalysable_attention():
    model = _model("softmax")
    with pytest.raises(ZeroDivisionError), route_attention(model, on_maps=lambda i, m: 1 / 0):
        model(_batches()[0][:, :-1])
    assert all("forward" not in b.attention.__dict__ for b in model.blocks)

    class Opaque(nn.Module):
        def forward(self, x):
            return x

    model.blocks[1].attention = Opaque()
    with pytest.raises(UserError, match=r"layer 1.*attend_with_maps"):
        ActivationOutliers().run(model, _batches())


# --- the quantizer -----------------------------------------------------------------------------------
M = 100.0  # above the diagonal: masked, must neither enter a maximum nor change
X = torch.tensor(
    [[[[0.9, M, M], [0.3, -2.0, M], [0.7, 0.1, 1.5]], [[0.25, M, M], [-0.5, 0.2, M], [0.05, 0.4, -0.45]]]]
)  # (1, 2, 3, 3)
MAXIMA = {  # max |x| over causal entries of each group, read off X by hand
    "tensor": [[2.0] * 3, [2.0] * 3],
    "head": [[2.0] * 3, [0.5] * 3],
    "row": [[0.9, 2.0, 1.5], [0.25, 0.5, 0.45]],
}
LEVELS = {8: 127, 6: 31, 4: 7}  # 2^(b-1) - 1


@pytest.mark.parametrize("granularity", ["tensor", "head", "row"])
@pytest.mark.parametrize("bits", [8, 6, 4])
def test_quantizer_against_hand_computed_values(bits, granularity):
    got = absmax_quantize(X, bits, granularity)
    for h in range(2):
        for i in range(3):
            scale = LEVELS[bits] / MAXIMA[granularity][h][i]
            for j in range(3):
                x = float(X[0, h, i, j])
                want = x if j > i else round(x * scale) / scale  # Python's round: half to even, as torch's
                assert float(got[0, h, i, j]) == pytest.approx(want, abs=1e-6), (h, i, j)


def test_quantizer_hand_computed_4_bits_per_head():
    # head 0: max 2.0, scale 7/2 = 3.5: 0.9 -> 3.15 -> 3 -> 0.857143; 0.3 -> 1.05 -> 1 -> 0.285714;
    # -2 -> -7 -> -2; 0.7 -> 2.45 -> 2 -> 0.571429; 0.1 -> 0.35 -> 0; 1.5 -> 5.25 -> 5 -> 1.428571.
    # head 1: max 0.5, scale 14: 0.25 -> 3.5 -> 4 (half to even) -> 0.285714; -0.5 -> -0.5; 0.2 -> 2.8 -> 3
    # -> 0.214286; 0.05 -> 0.7 -> 1 -> 0.071429; 0.4 -> 5.6 -> 6 -> 0.428571; -0.45 -> -6.3 -> -6 -> -0.428571.
    want = torch.tensor(
        [
            [
                [[3 / 3.5, M, M], [1 / 3.5, -2.0, M], [2 / 3.5, 0.0, 5 / 3.5]],
                [[4 / 14, M, M], [-0.5, 3 / 14, M], [1 / 14, 6 / 14, -6 / 14]],
            ]
        ]
    )
    assert torch.allclose(absmax_quantize(X, 4, "head"), want, atol=1e-6)
    assert torch.equal(absmax_quantize(X, 16, "head"), X)  # 16 bits: no quantization
    assert torch.equal(absmax_quantize(torch.zeros(1, 1, 2, 2), 4, "row"), torch.zeros(1, 1, 2, 2))


def test_quantization_options_are_checked():
    with pytest.raises(UserError, match="granularity"):
        LogitQuantization(granularity="block")
    with pytest.raises(UserError, match="bits"):
        LogitQuantization(bits=[8, 1])
    assert LogitQuantization(bits=[4, 16, 8]).settings() == {"bits": [16, 8, 4], "granularity": "head"}


@pytest.mark.parametrize("attention", ["softmax", "diff"])
def test_16_bit_loss_equals_the_unprobed_loss_exactly(attention):
    model, batches = _model(attention), _batches()
    results = LogitQuantization(bits=[16, 8, 4], granularity="row").run(model, batches)
    total, count = torch.zeros((), dtype=torch.float64), 0
    with torch.no_grad():  # the plain model, its own forward (math backend), no probe machinery
        for batch in batches:
            per_token = F.cross_entropy(
                model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten(), reduction="none"
            )
            total += per_token.double().sum()
            count += per_token.numel()
    assert results["loss/bits_16"] == float(total / count)
    assert results["loss_increase/bits_16"] == 0.0
    assert results["loss_increase/bits_4"] == results["loss/bits_4"] - results["loss/bits_16"]
    assert results["loss/bits_8"] != results["loss/bits_16"]  # quantization reached the logits
    assert abs(results["loss/bits_8"] - results["loss/bits_16"]) < abs(
        results["loss/bits_4"] - results["loss/bits_16"]
    )
    fused = _model(attention, backend="sdpa")  # a fused backend: the same function up to rounding
    assert LogitQuantization(bits=[16]).run(fused, batches)["loss/bits_16"] == pytest.approx(
        float(total / count), rel=1e-5
    )


def test_probes_are_a_registry_kind():
    assert registry.get("probe", "outliers") is ActivationOutliers
    assert registry.get("probe", "quantization") is LogitQuantization
    built = registry.build("probe", {"name": "quantization", "granularity": "row"}, key="eval.probes")
    assert built.settings()["granularity"] == "row"
    with pytest.raises(UserError, match="did you mean 'outliers'"):
        registry.get("probe", "outlier", key="eval.probes")


# --- the report's probe tables (no MLflow: known numbers) -----------------------------------------------
def test_probe_tables_on_known_numbers():
    from types import SimpleNamespace

    from ablate.recipe.schema import Variant
    from ablate.report.probes import ProbeGroup, group_tables, summary_groups

    recipe = SimpleNamespace(variants={"a": Variant(label="A"), "b": Variant(label="B")})
    ctx = SimpleNamespace(recipe=recipe, scale="tiny")
    records = [
        SimpleNamespace(variant=v, seed=s, size="", state="finished", run_id=f"{v}{s}")
        for v in ("a", "b")
        for s in range(3)
    ]
    top1 = {"a": [3.00, 3.10, 3.20], "b": [2.90, 2.98, 3.09]}  # b - a: -0.10, -0.12, -0.11
    values = {
        f"{v}{s}": {
            "outliers/logits/top1": top1[v][s],
            "outliers/logits/median": 1.0,
            "outliers/logits/layer_00/top1": 9.0,
            "quantization/loss/bits_4": 5.0,
            "quantization/loss/bits_16": 4.0,
        }
        for v in ("a", "b")
        for s in range(3)
    }
    groups = summary_groups(values)
    assert groups == {
        ("outliers", "logits"): ["top1", "median"],
        ("quantization", "loss"): ["bits_16", "bits_4"],
    }
    table, diffs = group_tables(ProbeGroup(ctx, records, values, "outliers", "logits", ["top1", "median"]))
    row_a = next(line for line in table.splitlines() if line.startswith("| A"))
    assert "3.100 [2.852, 3.348]" in row_a and "| 3/3 " in row_a  # t(0.975, 2) = 4.3027
    row_b = next(line for line in diffs.splitlines() if line.startswith("| B"))
    assert "\u22120.110 [\u22120.135, \u22120.085] *" in row_b
