"""The `transformers` export (ablate.hf): each kind of model loads in `transformers` and computes what ablate
computes. transformers' own classes (Llama, DiffLlama) are the independent implementation: the logits of the
loaded folder are held to ablate's model within 1e-5 (float32, CPU), greedy `generate` to ablate's own greedy
loop for 20 tokens, and the folder's tokenizer to ablate's ids. Offline: the hub's variables say so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from ablate.core.errors import UserError  # noqa: E402
from ablate.data.tokenizers import EOD_TEXT, BpeTokenizer, ByteTokenizer, train_bpe  # noqa: E402
from ablate.hf.export import EXPORT_FILE, export_model  # noqa: E402
from ablate.hf.tokenizer import byte_tokenizer  # noqa: E402
from ablate.model.decoder import build_model  # noqa: E402

HERE = Path(__file__).resolve().parent
TEXT = "def f(x):\n    return x ** 2  # ünïcödé, <|endoftext|> as text\n"


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # a port nothing listens on
    monkeypatch.setenv("HF_HOME", "/nonexistent-hf-home")


def _model(attention, *, seed: int = 0, **model):
    """A tiny model whose every weight is random (no zero residual outputs, gains away from 1)."""
    cfg = {
        "vocab_size": 257,
        "d_model": 32,
        "n_layers": 3,
        "head_dim": 4,
        "attention": attention,
        "attention_backend": "math",
        "zero_init_residual": False,
        **model,
    }
    m = build_model(cfg, seed=seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in m.parameters():
            if p.ndim == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return m.eval()


def _export(model, folder: Path, tokenizer=None):
    return export_model(
        model, folder, tokenizer=tokenizer or byte_tokenizer(), eos=EOD_TEXT, max_positions=64
    )


def _same_logits(model, folder: Path, *, remote: bool) -> None:
    hf = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=remote).eval()
    tokens = torch.randint(0, 257, (2, 23), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        ours, theirs = model(tokens).double(), hf(tokens).logits.double()
    assert theirs.shape == ours.shape
    assert (ours - theirs).abs().max().item() < 1e-5
    assert ours.std().item() > 0.01  # a model that computes something, not all-zero logits


# μP with CompleteP's depth rule at a base smaller than the model: its multipliers are folded into the export.
MUP = {
    "parametrization": {
        "name": "mup",
        "base_d_model": 16,
        "base_head_dim": 2,
        "base_n_layers": 1,
        "depth": "completep",
    }
}

TRANSFORMERS = {
    "mha, interleaved rope": ("softmax", {}),
    "gqa, rotate_half rope, tied": (
        {"name": "softmax", "n_kv_heads": 2},
        {"position": {"name": "rope", "style": "rotate_half", "theta": 500.0}, "tie_embeddings": True},
    ),
    "wide heads, mup": (
        {"name": "softmax", "head_dim_mult": 2},
        MUP,
    ),
}


@pytest.mark.parametrize("case", TRANSFORMERS)
def test_the_transformer_is_llama_without_remote_code(tmp_path, case):
    attention, extra = TRANSFORMERS[case]
    model = _model(attention, **extra)
    exported = _export(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert exported.architecture == "LlamaForCausalLM" and not exported.remote_code
    assert config["architectures"] == ["LlamaForCausalLM"] and "auto_map" not in config
    assert not list(tmp_path.glob("*.py"))
    _same_logits(model, tmp_path, remote=False)


DIFFS = {
    "mha": ("diff", {}),
    "gqa, rotate_half rope": (
        {"name": "diff", "n_kv_heads": 2},
        {"position": {"name": "rope", "style": "rotate_half"}},
    ),
    "mup": (
        "diff",
        MUP,
    ),
}


@pytest.mark.parametrize("case", DIFFS)
def test_diff_v1_is_diffllama_without_remote_code(tmp_path, case):
    attention, extra = DIFFS[case]
    model = _model(attention, **extra)
    assert any(b.attention.subln.weight.std() > 0.1 for b in model.blocks)  # a gain to fold into o_proj
    exported = _export(model, tmp_path)
    assert exported.architecture == "DiffLlamaForCausalLM" and not exported.remote_code
    assert not list(tmp_path.glob("*.py"))
    _same_logits(model, tmp_path, remote=False)


@pytest.fixture
def plugin_path(monkeypatch):
    """`plugin_example` (this folder) importable, as an installed plugin package would be."""
    monkeypatch.syspath_prepend(str(HERE))


CUSTOM = {
    "diff v2, tied": ("diff_v2", {"tie_embeddings": True}, "DiffV2Attention"),
    "constant λ_init": ({"name": "diff", "lambda_init": {"name": "constant", "value": 0.8}}, {}, "λ_init"),
    "layernorm, gelu": ("softmax", {"norm": "layernorm", "ffn": "gelu"}, "GeluMLP, LayerNorm"),
    "a plugin's attention": ("test_local_attention", {}, "LocalAttention"),
}


@pytest.mark.parametrize("case", CUSTOM)
def test_other_models_take_the_custom_code_path(tmp_path, case, plugin_path):
    import plugin_example  # noqa: F401  (registers test_local_attention, as a recipe's imports: does)

    attention, extra, named = CUSTOM[case]
    model = _model(attention, **extra)
    exported = _export(model, tmp_path)
    assert exported.architecture == "AblateForCausalLM" and exported.remote_code
    assert named in exported.why_custom
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_ablate_lm.AblateForCausalLM"
    # the folder's code imports the installed ablate: no copied sources
    assert [p.name for p in tmp_path.glob("*.py")] == ["modeling_ablate_lm.py"]
    assert len((tmp_path / "modeling_ablate_lm.py").read_text().splitlines()) <= 4
    if case == "a plugin's attention":
        assert "plugin_example" in config["imports"]
    _same_logits(model, tmp_path, remote=True)
    record = json.loads((tmp_path / EXPORT_FILE).read_text())
    assert record["trust_remote_code"] is True and named in record["why_custom_code"]


def _greedy(model, prompt: torch.Tensor, steps: int) -> list[int]:
    """Greedy decoding written out: the argmax of the last position, appended, `steps` times."""
    tokens = prompt.clone()
    with torch.no_grad():
        for _ in range(steps):
            nxt = model(tokens)[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], dim=1)
    return tokens[0, prompt.shape[1] :].tolist()


@pytest.mark.parametrize("attention", ["softmax", "diff", "diff_v2"])
def test_generate_gives_ablates_greedy_tokens_for_20_steps(tmp_path, attention):
    model = _model(attention, seed=3)
    exported = _export(model, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=exported.remote_code).eval()
    prompt = torch.from_numpy(ByteTokenizer().encode("def main(").astype("int64"))[None]
    expected = _greedy(model, prompt, 20)
    with torch.no_grad():
        out = hf.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=20,
            min_new_tokens=20,
            do_sample=False,
        )
    assert out[0, prompt.shape[1] :].tolist() == expected
    assert len(set(expected)) > 1  # the check would pass for a model stuck on one token too; this one is not


def test_the_exported_byte_tokenizer_encodes_to_ablates_ids(tmp_path):
    _export(_model("softmax"), tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    ours = ByteTokenizer().encode(TEXT).tolist()
    assert tok.encode(TEXT) == ours == list(TEXT.encode("utf-8"))
    assert tok.eos_token == EOD_TEXT and tok.eos_token_id == 256 and tok.bos_token is None
    assert tok.decode(ours) == TEXT


def test_the_exported_bpe_tokenizer_encodes_to_ablates_ids(tmp_path):
    texts = [f"def f{i}(x):\n    return x * {i} + x ** 2\n" for i in range(200)]
    raw = train_bpe(texts, 300)
    ours = BpeTokenizer(raw, {"name": "bpe", "vocab_size": 300})
    model = _model("softmax", vocab_size=300)
    _export(model, tmp_path, tokenizer=raw)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert tok.encode(TEXT) == ours.encode(TEXT).tolist()
    assert len(tok.encode(TEXT)) < len(TEXT.encode())  # merges were used
    assert tok.eos_token_id == ours.eos_id


def test_a_component_no_loader_can_import_is_refused_naming_it(tmp_path):
    from torch import nn

    model = _model("softmax")

    class Scratch(nn.Module):  # defined inside a function: nothing can import it by name
        def forward(self, x):
            return x

    model.blocks[1].ffn_norm = Scratch()
    with pytest.raises(UserError, match=r"export: blocks\.1\.ffn_norm is .*Scratch") as err:
        _export(model, tmp_path)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "config.json").exists()


def test_an_out_folder_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "taken").write_text("a file, not a folder")
    with pytest.raises(UserError, match=r"^--out: cannot make the folder .*taken/hf") as err:
        _export(_model("softmax"), tmp_path / "taken" / "hf")
    assert "\n" not in str(err.value)
