"""`model.parametrization`: standard is what it always was, bitwise; mup's lrs, inits and multipliers are the
written rules (recomputed here in float64 from the rules, not from the code's tables); an undeclared
parameter under mup is one line."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ablate.core.errors import UserError
from ablate.core.registry import load_plugins
from ablate.model.decoder import build_model
from ablate.train.config import TrainConfig
from ablate.train.module import LMModule

FIXTURE = Path(__file__).parent / "fixtures" / "standard_parametrization.json"
ROWS = {
    "transformer": {"name": "softmax"},
    "diff": {"name": "diff", "per_head_norm": True, "lambda_init": {"name": "exp_depth"}},
}
CFG = TrainConfig(seq_len=16, batch_tokens=64, micro_batch_size=4, steps=4, lr=1e-2, warmup_steps=0)


@pytest.fixture(autouse=True, scope="module")
def _plugins():
    load_plugins()


def tiny(attention: dict, **changes) -> dict:
    return {
        "vocab_size": 64,
        "d_model": 32,
        "n_layers": 2,
        "head_dim": 8,
        "attention": attention,
        "attention_backend": "math",
        "zero_init_residual": False,
        **changes,
    }


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 4) -> list[float]:
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, 64, (4, 17), generator=gen)
        loss = F.cross_entropy(model(tokens[:, :-1]).float().flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def record(row: str) -> dict:
    """What the fixture holds, computed by the code as it is now (the fixture was written before μP existed)."""
    model = build_model(tiny(ROWS[row]), seed=3)
    state = hashlib.sha256()
    for name, p in model.named_parameters():
        state.update(name.encode())
        state.update(p.detach().numpy().tobytes())
    optimizer = LMModule(model, CFG, None).configure_optimizers()["optimizer"]
    names = {id(p): n for n, p in model.named_parameters()}
    groups = [
        {
            "params": [names[id(p)] for p in g["params"]],
            "lr": g["lr"],
            "weight_decay": g["weight_decay"],
            "eps": g["eps"],
        }
        for g in optimizer.param_groups
    ]
    return {"init_sha256": state.hexdigest(), "groups": groups, "losses": train(model, optimizer)}


@pytest.mark.parametrize("row", ROWS)
def test_standard_is_what_it_was_before_parametrizations(row):
    """Init draws (hashed bytes) and the optimizer's groups equal the fixture recorded from the code before
    `model.parametrization` existed, exactly; the losses of 4 AdamW steps agree to float32 rounding (the
    fixture's machine may differ from this one)."""
    before = json.loads(FIXTURE.read_text())[row]
    now = record(row)
    assert now["init_sha256"] == before["init_sha256"]
    assert now["groups"] == before["groups"]
    assert now["losses"] == pytest.approx([float.fromhex(x) for x in before["losses"]], rel=1e-5)


@pytest.mark.parametrize("row", ROWS)
def test_standard_trains_bitwise_as_the_old_optimizer(row):
    """The training module's optimizer against the old construction written out here (two groups: decay on
    2+-dimensional parameters): the same losses and weights, bit for bit."""
    new = build_model(tiny(ROWS[row]), seed=5)
    old = build_model(tiny(ROWS[row]), seed=5)
    decay = [p for p in old.parameters() if p.ndim >= 2]
    no_decay = [p for p in old.parameters() if p.ndim < 2]
    old_opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": CFG.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=CFG.lr,
        betas=tuple(CFG.betas),
        eps=CFG.eps,
    )
    new_opt = LMModule(new, CFG, None).configure_optimizers()["optimizer"]
    assert train(new, new_opt) == train(old, old_opt)
    for (name, a), (_, b) in zip(new.named_parameters(), old.named_parameters(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("row", ROWS)
def test_mup_at_its_base_shape_is_standard(row):
    """μP's hyperparameters are the base model's: at the base shape it trains exactly as standard."""
    base = {"name": "mup", "base_d_model": 32, "base_head_dim": 8, "base_n_layers": 2, "depth": "completep"}
    mup = build_model(tiny(ROWS[row], parametrization=base), seed=5)
    std = build_model(tiny(ROWS[row]), seed=5)
    losses = [train(m, LMModule(m, CFG, None).configure_optimizers()["optimizer"]) for m in (mup, std)]
    assert losses[0] == losses[1]


# --- the rules, recomputed -------------------------------------------------------------------------------

BASE_D, BASE_HEAD, BASE_L = 32, 8, 1
ETA, LAMBDA, EPS, SIGMA = 1e-2, 0.1, 1e-8, 0.02


def expected_role(name: str) -> str:
    """The roles the rules give, by what each parameter is (written here, not read from the components)."""
    if name == "embed.weight":
        return "input"
    if name == "lm_head.weight":
        return "head"
    if name.endswith(("norm.weight", "subln.weight")) or ".lambda_" in name:
        return "vector"
    return "hidden"


def fan_in_ratio(name: str, d: int) -> float:
    """fan_in / base fan_in: d_model for every projection but the FFN's w2, whose fan-in is round(8/3 d)."""
    if name.endswith("ffn.w2.weight"):
        return round(8 / 3 * d) / round(8 / 3 * BASE_D)
    return d / BASE_D


def mup_config(row: str, d: int) -> dict:
    spec = {
        "name": "mup",
        "base_d_model": BASE_D,
        "base_head_dim": BASE_HEAD,
        "base_n_layers": BASE_L,
        "depth": "completep",
    }
    return tiny(ROWS[row], d_model=d, head_dim=d // 4, parametrization=spec)


@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("d", [64, 128])
def test_mup_groups_inits_and_multipliers_follow_the_rules(row, d):
    """At two widths (2x and 4x the base, head width and depth 2x the base's too): every parameter's Adam lr,
    weight decay and eps, its init against standard's draw, and the forward multipliers, in float64."""
    config = mup_config(row, d)
    model = build_model(config, seed=7)
    standard = build_model({**config, "parametrization": "standard"}, seed=7)
    cfg = TrainConfig(**{**CFG.__dict__, "weight_decay": LAMBDA, "eps": EPS})
    optimizer = LMModule(model, cfg, None).configure_optimizers()["optimizer"]
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    m_n, m_l, m_d = d / BASE_D, 2 / BASE_L, (d // 4) / BASE_HEAD
    seen = set()
    for name, p in model.named_parameters():
        role, ratio = expected_role(name), fan_in_ratio(name, d)
        in_block = name.startswith("blocks.")
        eps = EPS / m_n / (m_l if in_block else 1.0)
        lr, wd, init = {
            "input": (ETA, LAMBDA, 1.0),
            "head": (ETA, LAMBDA, 1.0),
            "hidden": (ETA / ratio, LAMBDA * ratio, 1 / math.sqrt(ratio)),
            "vector": (ETA, 0.0, 1.0),
        }[role]
        if name.endswith(("out_proj.weight", "w2.weight")):  # GPT-2's residual init, taken at the base depth
            init *= math.sqrt(2 * 2) / math.sqrt(2 * BASE_L)
        group = group_of[id(p)]
        assert group["lr"] == pytest.approx(lr, rel=1e-12), name
        assert group["weight_decay"] == pytest.approx(wd, rel=1e-12, abs=0), name
        assert group["eps"] == pytest.approx(eps, rel=1e-12), name
        drawn, reference = p.detach().double(), standard.get_parameter(name).detach().double()
        if role == "vector":  # the model's own rule: ones, or the λ vectors' Normal(0, lambda_std), unchanged
            assert torch.equal(drawn, reference), name
        else:  # the same draw, scaled; float32 rounding of both draws bounds the error
            assert torch.allclose(drawn, reference * init, rtol=1e-6, atol=1e-9), name
        seen.add(name)
    assert len(seen) == len(list(model.parameters()))
    assert model.output_mult == pytest.approx(1 / m_n, rel=1e-15)
    for block in model.blocks:
        assert block.branch_mult == pytest.approx(1 / m_l, rel=1e-15)
        assert block.attention.q_scale == pytest.approx(m_d**-0.5, rel=1e-15)
    if row == "diff":
        assert model.blocks[0].attention.lambda_dot_scale == pytest.approx(1 / m_d, rel=1e-15)


def test_mup_forward_in_float64():
    """The forward's μP scales against a float64 reference written here: softmax attention's logits
    Q K^T sqrt(d_base) / d, diff's λ = exp(s λq1·λk1) - exp(s λq2·λk2) + λ_init with s = d_base / d, the
    residual branches times base depth / depth and the logits lm_head(norm(x) d_base_model / d_model)."""
    torch.manual_seed(0)
    config = mup_config("transformer", 64)
    config["position"] = "none"
    model = build_model(config, seed=1).double()
    x = torch.randn(2, 5, 64, dtype=torch.float64)
    attn = model.blocks[0].attention
    d = attn.head_width
    q = (x @ attn.q_proj.weight.T).view(2, 5, -1, d).transpose(1, 2)
    k = (x @ attn.k_proj.weight.T).view(2, 5, -1, d).transpose(1, 2)
    v = (x @ attn.v_proj.weight.T).view(2, 5, -1, d).transpose(1, 2)
    logits = q @ k.transpose(-1, -2) * math.sqrt(BASE_HEAD) / d
    logits = logits.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, 64) @ attn.out_proj.weight.T
    # The math backend's softmax runs in float32; a wrong scale (1/sqrt(d)) moves the output by ~1e-4.
    assert torch.allclose(attn(x), out, rtol=1e-5, atol=1e-8)
    wrong = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(
        torch.ones(5, 5, dtype=torch.bool).triu(1), -math.inf
    )
    wrong = (wrong.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, 64) @ attn.out_proj.weight.T
    assert not torch.allclose(attn(x), wrong, rtol=1e-5, atol=1e-8)

    tokens = torch.randint(0, 64, (2, 5))
    h = model.embed(tokens)
    for block in model.blocks:
        h = h + (BASE_L / 2) * block.attention(block.attn_norm(h))
        h = h + (BASE_L / 2) * block.ffn(block.ffn_norm(h))
    expected = model.final_norm(h) * (BASE_D / 64) @ model.lm_head.weight.T
    assert torch.allclose(model(tokens), expected, rtol=1e-5, atol=1e-8)

    diff = build_model(mup_config("diff", 64), seed=1).blocks[1].attention
    s = BASE_HEAD / diff.head_dim
    lam = (
        math.exp(s * float((diff.lambda_q1.detach().double() * diff.lambda_k1.detach().double()).sum()))
        - math.exp(s * float((diff.lambda_q2.detach().double() * diff.lambda_k2.detach().double()).sum()))
        + diff.lambda_init
    )
    assert float(diff.lambda_value()) == pytest.approx(lam, rel=1e-6)


# --- the contract --------------------------------------------------------------------------------------


class Gated(nn.Module):
    """A user's attention: softmax-free, with one parameter (`gate`) it does not declare."""

    parameter_roles = {"proj.weight": "hidden"}

    def __init__(self, *, d_model: int, head_ratio: float = 1.0):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.gate = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * self.gate


def test_an_undeclared_parameter_is_refused_in_one_line_under_mup():
    attention = {"class_path": f"{__name__}.Gated"}
    build_model(tiny(attention), seed=0)  # standard never reads roles
    with pytest.raises(UserError) as e:
        build_model(tiny(attention, d_model=64, parametrization={"name": "mup", "base_d_model": 32}), seed=0)
    line = str(e.value)
    assert "\n" not in line
    assert line.startswith("model.attention: Gated does not declare parameter 'gate'")
    assert "parameter_roles" in line and "input, hidden, output, vector" in line


class NoRatio(nn.Module):
    parameter_roles = {"proj.weight": "hidden"}

    def __init__(self, *, d_model: int):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def test_an_attention_without_head_ratio_is_refused_where_the_head_width_changes():
    attention = {"class_path": f"{__name__}.NoRatio"}
    spec = {"name": "mup", "base_d_model": 32, "base_head_dim": 8}
    build_model(tiny(attention, d_model=64, parametrization=spec), seed=0)  # head width as the base: fine
    with pytest.raises(UserError, match=r"^model.attention: NoRatio does not take head_ratio"):
        build_model(tiny(attention, d_model=64, head_dim=16, parametrization=spec), seed=0)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("mu", r"^model.parametrization.name: 'mu' is not one of standard, mup$"),
        ({"name": "mup"}, r"^model.parametrization.base_d_model: mup needs"),
        (
            {"name": "mup", "base_d_model": 0},
            r"^model.parametrization.base_d_model: expected an integer from 1 to",
        ),
        ({"name": "mup", "base_d_model": 32, "depth": "x"}, r"^model.parametrization.depth: 'x'"),
        ({"name": "mup", "base_d_model": 32, "width": 1}, r"^model.parametrization.width: unknown key"),
        ({"name": "standard", "base_d_model": 32}, r"^model.parametrization.base_d_model: only mup"),
    ],
)
def test_a_wrong_parametrization_is_one_line(spec, message):
    with pytest.raises(UserError, match=message):
        build_model(tiny(ROWS["transformer"], parametrization=spec), seed=0)


def test_a_standard_run_keeps_its_key():
    """Runs recorded before the key existed keep their identity: the run key is the hash the old code took,
    of a model section without `parametrization`; a mup run's key differs."""
    import hashlib

    from ablate.recipe.schema import RunSpec

    raw = {
        "recipe": "r",
        "variant": "v",
        "label": "v",
        "scale": "s",
        "seed": 0,
        "size": None,
        "model": tiny(ROWS["transformer"]),
        "train": {"seq_len": 16, "batch_tokens": 64, "micro_batch_size": 4, "steps": 4, "lr": 1e-2},
        "data": {"source": "stdlib"},
    }
    run = RunSpec.from_json(raw)
    assert run.config["model"]["parametrization"] == "standard"
    old_model = {k: v for k, v in run.config["model"].items() if k != "parametrization"}
    ident = {
        "recipe": "r",
        "variant": "v",
        "scale": "s",
        "seed": 0,
        "size": None,
        "config": {
            **run.config,
            "model": old_model,
            "train": {  # before `compile: auto` became the default, its default `false` was keyed
                **{
                    k: v
                    for k, v in run.config["train"].items()
                    if k
                    not in (
                        "schedule",
                        "cooldown_fraction",
                        "cooldown_shape",
                        "activation_checkpointing",
                        "gpu_memory_gb",
                    )
                },
                "compile": False,
            },
            "data": {k: v for k, v in run.config["data"].items() if k != "repeat"},
        },
    }
    old_key = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert run.key == old_key
    mup = {**raw, "model": {**raw["model"], "parametrization": {"name": "mup", "base_d_model": 16}}}
    assert RunSpec.from_json(mup).key != old_key
    assert run.config["train"]["compile"] == "auto"
    assert RunSpec.from_json({**raw, "train": {**raw["train"], "compile": False}}).key == old_key
    assert RunSpec.from_json({**raw, "train": {**raw["train"], "compile": True}}).key != old_key


def test_mup_parses_once_and_builds_its_base_model_once(monkeypatch):
    """The model's config parses `parametrization` (the base model's config parses its own); the model's
    initialisation and its optimiser's groups share one base model on `meta`."""
    from ablate.model import parametrization as param
    from ablate.model.config import ModelConfig

    calls = {"parse": 0, "base_model": 0}

    def counted(name):
        real = getattr(param, name)

        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(param, name, call)

    counted("parse")
    counted("base_model")
    config = ModelConfig(**tiny({"name": "softmax"}, parametrization={"name": "mup", "base_d_model": 16}))
    assert calls == {"parse": 1, "base_model": 0}
    model = build_model(config, seed=0)
    LMModule(model, CFG, None).configure_optimizers()
    LMModule(model, CFG, None).configure_optimizers()
    assert calls == {"parse": 2, "base_model": 1}  # the second parse: the base model's own config
