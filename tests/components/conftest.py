"""Shared test doubles and float64 references written from the paper's equations (not from the code).

- `fake_flash`: a stand-in `flash_attn` package (plain torch, flash-attn 2's calling convention and
  layout) so the production flash_attn path runs on CPU; it records its calls.
- `rope_reference`, `diff_reference`, `softmax_reference`: float64 implementations with explicit loops
  over heads and rotation pairs.
"""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch

from components.attention import sdpa


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors gain nothing from intra-op threads, and on a loaded machine OpenMP's spinning
    made these tests 4-7x slower; restore the setting afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _fake_flash_attn_func(calls: list):
    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, **unused):
        # flash-attn 2: (batch, seq, heads, width), q/k/v of one width, kv heads dividing query heads.
        assert q.dim() == k.dim() == v.dim() == 4
        assert q.shape[-1] == k.shape[-1] == v.shape[-1], "flash-attn needs equal q/k/v widths"
        assert k.shape == v.shape and q.shape[:2] == k.shape[:2]
        assert q.shape[2] % k.shape[2] == 0, "number of query heads must be divisible by kv heads"
        assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1, "last dimension must be contiguous"
        calls.append({"q": tuple(q.shape), "k": tuple(k.shape), "causal": causal, "dropout_p": dropout_p})
        repeat = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
        scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
        if causal:
            n = q.shape[1]
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)

    return flash_attn_func


@pytest.fixture
def fake_flash(monkeypatch) -> list:
    """Install the stand-in `flash_attn` module; returns the list its calls are recorded in."""
    calls: list = []
    module = types.ModuleType("flash_attn")
    module.flash_attn_func = _fake_flash_attn_func(calls)
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    monkeypatch.setattr(sdpa, "FLASH_ATTN", module.flash_attn_func)  # probed at import: set it here
    return calls


@pytest.fixture
def no_flash(monkeypatch) -> None:
    """Make `import flash_attn` fail, and the probe made at import say so, whatever is installed."""
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    monkeypatch.setattr(sdpa, "FLASH_ATTN", None)


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    expected = expected.double()
    return ((actual.double() - expected).norm() / expected.norm()).item()


def rope_ref(x: torch.Tensor, style: str, theta: float = 10000.0) -> torch.Tensor:
    """Rotate x (..., N, d): pair p = (2i, 2i+1) (interleaved) or (i, i + d/2) (rotate_half) of the
    vector at position n turns by n * theta^(-2i/d)."""
    n, d = x.shape[-2:]
    out = x.clone()
    for i in range(d // 2):
        a, b = (2 * i, 2 * i + 1) if style == "interleaved" else (i, i + d // 2)
        angle = torch.arange(n, dtype=torch.float64) * theta ** (-2 * i / d)
        cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
        out[..., a] = x[..., a] * cos - x[..., b] * sin
        out[..., b] = x[..., a] * sin + x[..., b] * cos
    return out


def _causal_softmax(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    n, d = q.shape[-2:]
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    mask = torch.tensor([[j > i for j in range(n)] for i in range(n)])
    return scores.masked_fill(mask, float("-inf")).softmax(-1)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def diff_ref(x, p, *, h, h_kv, lam_init, norm, rope, eps=1e-5, pairing="flash"):
    """Eq. 1-3 in float64 from a reference-layout parameter dict `p`; x (B,N,d_model).

    pairing "flash": Q1/Q2 of head i meet K1/K2 of kv group i // (h / h_kv) (the reference's
    FlashAttention files). "naive": query sub-head j meets key sub-head j // (h / h_kv) (its naive
    file, which repeats K after splitting it into sub-heads).
    """
    d = p["lambda_q1"].numel()
    q, k, v = x @ p["q_proj.weight"].T, x @ p["k_proj.weight"].T, x @ p["v_proj.weight"].T
    lam = (
        torch.exp((p["lambda_q1"] * p["lambda_k1"]).sum())
        - torch.exp((p["lambda_q2"] * p["lambda_k2"]).sum())
        + lam_init
    )
    repeat = h // h_kv

    def sub(t, j, width=d):
        part = t[..., j * width : (j + 1) * width]
        return rope_ref(part, rope) if rope and width == d else part

    heads = []
    for i in range(h):
        group = i // repeat
        if pairing == "flash":
            k1, k2 = sub(k, 2 * group), sub(k, 2 * group + 1)
        else:
            k1, k2 = sub(k, (2 * i) // repeat), sub(k, (2 * i + 1) // repeat)
        a1, a2 = _causal_softmax(sub(q, 2 * i), k1), _causal_softmax(sub(q, 2 * i + 1), k2)
        head = (a1 - lam * a2) @ v[..., group * 2 * d : (group + 1) * 2 * d]
        if norm:
            head = _rms(head, p["subln.weight"], eps)
        heads.append(head * (1 - lam_init))
    return torch.cat(heads, dim=-1) @ p["out_proj.weight"].T


def softmax_ref(x, p, *, heads, kv_heads, width, norm, rope, eps=1e-5):
    """Causal multi-head softmax attention in float64 (head i reads kv head i // (heads / kv_heads))."""
    q, k, v = x @ p["q_proj.weight"].T, x @ p["k_proj.weight"].T, x @ p["v_proj.weight"].T

    def sub(t, j, rotate=True):
        part = t[..., j * width : (j + 1) * width]
        return rope_ref(part, rope) if rope and rotate else part

    outs = []
    for i in range(heads):
        group = i // (heads // kv_heads)
        head = _causal_softmax(sub(q, i), sub(k, group)) @ sub(v, group, rotate=False)
        outs.append(_rms(head, p["subln.weight"], eps) if norm else head)
    return torch.cat(outs, dim=-1) @ p["out_proj.weight"].T


@pytest.fixture
def reference():
    return types.SimpleNamespace(rope=rope_ref, diff=diff_ref, softmax=softmax_ref, rel_err=rel_err)
