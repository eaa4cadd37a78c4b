"""The component contract: automatic FLOPs, the columns a component describes, the structure check, and the
docs' "Add a component" example (docs/recipes-and-components.md) beside Table 6's rows."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
import yaml
from cli_helpers import run_cli
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from ablate.core import contract
from ablate.core.registry import build
from ablate.model.cost import model_cost
from ablate.model.decoder import build_model
from ablate.recipe.loading import load_recipe

ROOT = Path(__file__).resolve().parents[2]
TABLE6 = ROOT / "recipes" / "table6.yaml"
D_MODEL, HEAD_DIM, SEQ = 64, 8, 48
STRUCTURE = {"d_model": D_MODEL, "head_dim": HEAD_DIM, "layer_idx": 1, "n_layers": 2, "position": "rope"}
ATTENTIONS = [
    {"name": "softmax"},
    {"name": "softmax", "head_dim_mult": 2, "per_head_norm": True},
    {"name": "softmax", "n_kv_heads": 2},
    {"name": "softmax", "n_kv_heads": 1, "head_dim_mult": 2},
    {"name": "diff"},
    {"name": "diff", "n_kv_heads": 2, "per_head_norm": False},
    {"name": "diff_v2"},
    {"name": "diff_v2", "n_kv_heads": 2},
    {"name": "diff_v2", "heads_mult": 0.5, "n_kv_heads": 1},
]
# Counting measures what a forward executes: softmax and Diff V2 make one attention call whatever the
# backend; Diff (V1) under a fused backend runs Appendix A's split-V form, which executes more than Eq. 1's one
# product (its `kernel_forms`), so its formula is compared with the math form it is written for.
BUILT_IN = [
    ("attention", spec, backend)
    for spec in ATTENTIONS
    for backend in (("math",) if spec["name"] == "diff" else ("math", "sdpa", "auto"))
] + [
    ("norm", {"name": "rmsnorm"}, None),
    ("norm", {"name": "layernorm"}, None),
    ("ffn", {"name": "swiglu"}, None),
    ("ffn", {"name": "gelu", "hidden_mult": 3.0}, None),
]


def make(kind: str, spec: dict, backend: str | None) -> torch.nn.Module:
    structure = {
        "attention": {**STRUCTURE, "backend": backend},
        "norm": {"dim": D_MODEL},
        "ffn": {"d_model": D_MODEL},
    }[kind]
    return build(kind, spec, key=f"model.{kind}", **structure)


def readme_example() -> str:
    section = (ROOT / "docs" / "recipes-and-components.md").read_text().split("### Add a component", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def readme_module(tmp_path, monkeypatch):
    """The docs' example as the user's file `my_attention.py`, importable."""
    (tmp_path / "my_attention.py").write_text(readme_example())
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_attention

    return my_attention


def tiny_recipe(tmp_path: Path, variants: dict, **top) -> Path:
    """Table 6's `transformer` and `diff` rows at its tiny scale, then `variants`."""
    raw = yaml.safe_load(TABLE6.read_text())
    recipe = {
        **{k: raw[k] for k in ("tolerance", "base")},
        "scales": {"tiny": raw["scales"]["tiny"]},  # others (cpu-tokens) list rows left out here
        "name": "contract_test",
        **top,
        "variants": {
            "transformer": raw["variants"]["transformer"],
            "diff": raw["variants"]["diff"],
            **variants,
        },
    }
    recipe["base"] = copy.deepcopy(recipe["base"])
    recipe["base"]["data"] = {"source": "stdlib", "tokenizer": {"name": "byte"}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True))
    return path


def checked(capsys, path: Path) -> str:
    """What `ablate check RECIPE --scale tiny` prints, having passed (exit 0)."""
    code, out, err = run_cli(capsys, "check", path, "--scale", "tiny")
    assert code == 0, err
    return out


def check_rows(out: str) -> dict[str, dict[str, str]]:
    lines = [line for line in out.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return {
        cells[0]: dict(zip(header, cells))
        for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])
    }


# --- FLOPs without arithmetic -----------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "spec", "backend"), BUILT_IN, ids=[f"{k}-{s}-{b}" for k, s, b in BUILT_IN])
def test_counted_flops_agree_with_the_hand_formulas(kind, spec, backend):
    """Counting is trusted for plugins because it agrees with every built-in's formula (built on meta)."""
    with torch.device("meta"):
        module = make(kind, spec, backend)
    hand = module.flops(SEQ)
    assert contract.counted_flops(module, SEQ, D_MODEL) == pytest.approx(hand, rel=0.01, abs=0)
    assert contract.component_flops(module, SEQ, D_MODEL) == (hand, "hand")


def test_counted_flops_of_the_readme_example(readme_module):
    """Against FlopCounterMode on the real module (math attention, real tensors) and a formula written here."""
    module = readme_module.GatedAttention(d_model=D_MODEL, head_dim=HEAD_DIM)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        module(torch.randn(1, SEQ, D_MODEL))
    heads = D_MODEL // HEAD_DIM
    formula = 2 * SEQ * D_MODEL * (3 * D_MODEL + heads + D_MODEL) + 2 * 2 * heads * SEQ * SEQ * HEAD_DIM
    assert counter.get_total_flops() == formula
    assert contract.component_flops(module, SEQ, D_MODEL) == (pytest.approx(formula, rel=0.01), "counted")
    with torch.device("meta"):
        on_meta = readme_module.GatedAttention(d_model=D_MODEL, head_dim=HEAD_DIM)
    assert contract.counted_flops(on_meta, SEQ, D_MODEL) == pytest.approx(formula, rel=0.01)


def test_a_model_with_a_counted_component_is_budgeted(readme_module):
    config = {"vocab_size": 97, "d_model": D_MODEL, "n_layers": 2, "head_dim": HEAD_DIM, "attention": "gated"}
    budget = model_cost(config, SEQ)
    assert budget.counted == ("attention",)
    model = build_model(config, seed=0)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(torch.randint(0, 97, (1, SEQ)))
    assert budget.fwd_flops_per_token == pytest.approx(counter.get_total_flops() / SEQ, rel=0.01)
    assert model_cost({**config, "attention": "softmax"}, SEQ).counted == ()
    # counting the real model (weights on the CPU) gives the same, and runs on a copy: the real model still
    # computes (its RoPE cache holds no fake tensors) and its weights are untouched
    before = {n: p.clone() for n, p in model.named_parameters()}
    assert model.flops(SEQ) == pytest.approx(budget.fwd_flops_per_token * SEQ, rel=1e-9)
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert torch.isfinite(model(torch.randint(0, 97, (2, SEQ)))).all()


# --- what a component describes -----------------------------------------------------------------------


def test_columns_come_from_describe_and_default_to_unknown():
    with torch.device("meta"):
        diff = make("attention", {"name": "diff", "lambda_init": {"name": "constant", "value": 0.5}}, "math")
    assert contract.attention_columns(diff) == {
        "heads": "4",
        "d": "8",
        "gn": "yes",
        "lambda_init": "constant 0.5",
    }
    assert contract.attention_columns(torch.nn.Linear(2, 2)) == {
        "heads": "?",
        "d": "?",
        "gn": "?",
        "lambda_init": "-",
    }


def test_consumed_structure_reads_the_constructor():
    class Takes:
        def __init__(self, *, d_model: int, head_dim: int, window: int = 3): ...

    class TakesAll:
        def __init__(self, **anything): ...

    assert contract.consumed(Takes, "attention") == {"d_model", "head_dim"}
    assert contract.consumed(TakesAll, "attention") == set(contract.INJECTED["attention"])


# --- the docs' example beside Table 6 ----------------------------------------------------------------


def test_readme_example_is_matched_beside_table6(tmp_path, capsys, readme_module):
    assert len([line for line in readme_example().splitlines() if line.strip()]) <= 20
    path = tiny_recipe(
        tmp_path,
        {"gated": {"label": "Gated", "model": {"attention": {"name": "gated"}}}},
        imports=["my_attention"],
    )
    out = checked(capsys, path)
    rows = check_rows(out)
    assert list(rows) == ["transformer", "diff", "gated"]
    assert (rows["gated"]["#heads"], rows["gated"]["d"], rows["gated"]["GN"]) == ("8", "16", "no")
    assert rows["gated"]["matched"] == "ok"
    assert "counted automatically" in out and "variants.gated (attention)" in out
    assert "does not take" not in out  # it takes the recipe's position encoding
    (run,) = load_recipe(path).resolve("tiny", variants=["gated"])
    model = build_model(run.config["model"], seed=0)
    assert type(model.blocks[0].attention).__name__ == "GatedAttention"
    assert model.blocks[0].attention.out_proj.weight.abs().sum() == 0  # residual_out honoured
    assert type(model.blocks[0].attention.rope).__name__ == "RoPE"


PLUGIN_WITHOUT_POSITION = '''
from torch import nn
from ablate.core.registry import register

@register("attention", "no_rope_attention")
class NoRope(nn.Module):
    """Causal softmax attention that takes no position encoding."""
    residual_out = ("out_proj.weight",)

    def __init__(self, *, d_model: int, head_dim: int):
        super().__init__()
        self.h, self.d = d_model // head_dim, head_dim
        self.qkv, self.out_proj = nn.Linear(d_model, 3 * d_model, bias=False), nn.Linear(d_model, d_model, bias=False)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, self.h, self.d).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(a.transpose(1, 2).reshape(b, n, -1))
'''


def test_a_plugin_without_position_beside_rope_rows_is_named(tmp_path, capsys, monkeypatch):
    (tmp_path / "no_rope_plugin.py").write_text(PLUGIN_WITHOUT_POSITION)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tiny_recipe(
        tmp_path,
        {"plain": {"label": "Plain", "model": {"attention": {"name": "no_rope_attention"}}}},
        imports=["no_rope_plugin"],
    )
    out = checked(capsys, path)
    expected = (
        "variants.plain: model.attention does not take model.position (rope) that the other rows use: "
        "it trains without positional encoding"
    )
    assert expected in out.splitlines()
    differences = [line for line in out.splitlines() if "does not take" in line]
    assert differences == [expected]  # one line per difference; transformer and diff take what they need
    assert check_rows(out)["plain"]["#heads"] == "?"  # it describes nothing

    raw = yaml.safe_load(path.read_text())  # without position encoding anywhere there is nothing to miss
    raw["base"]["model"]["position"] = "none"
    path.write_text(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
    out = checked(capsys, path)
    assert "does not take" not in out


class _Repeated(torch.nn.Module):
    """A component whose FLOPs depend on a plain attribute, not on its tensors' shapes."""

    def __init__(self, repeats: int):
        super().__init__()
        self.repeats, self.proj = repeats, torch.nn.Linear(D_MODEL, D_MODEL, bias=False)

    def forward(self, x):
        for _ in range(self.repeats):
            x = self.proj(x)
        return x


def test_counting_is_cached_per_configuration_not_per_class():
    one, three = _Repeated(1), _Repeated(3)
    assert contract.counted_flops(one, SEQ, D_MODEL) == 2 * SEQ * D_MODEL * D_MODEL
    assert contract.counted_flops(three, SEQ, D_MODEL) == 3 * 2 * SEQ * D_MODEL * D_MODEL
    assert contract.counted_flops(one, SEQ, D_MODEL) == 2 * SEQ * D_MODEL * D_MODEL
