"""Attention cores: backend selection, the flash-attn seam, each core against float64 formulas, and
which SDPA kernel actually runs on CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from ablate.core.errors import UserError
from ablate.core.registry import build
from components.attention import backends, sdpa

FUSED_CPU = "aten::_scaled_dot_product_flash_attention_for_cpu"
MATH = "aten::_scaled_dot_product_attention_math"
CUDA = torch.device("cuda")  # a device object only: nothing runs on it
# Every backend of the table with a CPU kernel, and flash_attn through its CPU stand-in (`fake_flash`);
# triton runs in Triton's interpreter in test_triton_attention.py.
ON_CPU = [name for name, b in backends.TABLE.items() if "cpu" in b.runs_on] + ["flash_attn"]


def softmax64(q, k, v):
    """Causal softmax attention in float64, kv heads repeated per group; q (B,H,N,d), k/v (B,G,N,e)."""
    q, k, v = q.double(), k.double(), v.double()
    repeat = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1)
    n = q.shape[2]
    scores = torch.einsum("bhid,bhjd->bhij", q, k) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1), torch.einsum("bhij,bhje->bhie", scores.softmax(-1), v)


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def printed(script: str) -> list[str]:
    """The words `script` prints in a fresh interpreter started in the repository (what it imports and
    reads counted from nothing: this process has imported everything already)."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_flash_seam_reports_a_missing_package(no_flash):
    with pytest.raises(UserError) as e:
        sdpa.flash_attn_func()
    assert str(e.value) == (
        "flash_attn backend: the flash-attn package is not installed (pip install 'ablate[flash]', CUDA only)"
    )
    with pytest.raises(UserError, match="flash-attn package is not installed"):
        build("attention", "diff", d_model=32, head_dim=4, layer_idx=0, n_layers=1, backend="flash_attn")


def test_flash_seam_returns_the_installed_function(fake_flash):
    assert sdpa.flash_attn_func() is sys.modules["flash_attn"].flash_attn_func


def test_resolve(fake_flash, monkeypatch):
    cpu = torch.device("cpu")
    assert backends.resolve("auto", cpu, torch.bfloat16, head_dim=32) == "sdpa"  # 64 wide: test_fast_paths
    assert backends.resolve("auto", CUDA, torch.bfloat16) == "flash_attn"
    assert backends.resolve("auto", CUDA, torch.float16) == "flash_attn"
    assert backends.resolve("auto", CUDA, torch.float32) == "sdpa_efficient"  # flash-attn: no fp32 kernels
    for name in ("math", "sdpa", "flash_attn"):
        assert backends.resolve(name, cpu, torch.float32) == name
    monkeypatch.setattr(sdpa, "FLASH_ATTN", None)
    assert backends.resolve("auto", CUDA, torch.bfloat16) == "sdpa_flash"  # test_cuda_kernels


def test_the_table_holds_each_backend_once_with_both_cores():
    assert backends.BACKENDS == tuple(backends.TABLE) and backends.BACKENDS[0] == "auto"
    assert all(name == b.name for name, b in backends.TABLE.items())
    for b in backends.TABLE.values():
        assert b.runs_on and set(b.runs_on) <= {"cpu", "cuda"} and b.about, b.name
        cores = (b.softmax, b.diff)
        assert cores == (None, None) if b.name == "auto" else all(map(callable, cores)), b.name


def test_auto_is_resolved_once_per_module_and_device(monkeypatch):
    calls = []
    resolve = backends.resolve

    def counting(name, *args, **kwargs):
        calls.append(name)
        return resolve(name, *args, **kwargs)

    monkeypatch.setattr(backends, "resolve", counting)
    for kind, seq in (("diff", 8), ("softmax", 8)):
        calls.clear()
        module = build("attention", kind, d_model=32, head_dim=8, layer_idx=0, n_layers=1, backend="auto")
        x = torch.randn(1, seq, 32)
        for _ in range(3):
            module(x)
        assert calls.count("auto") == 1, kind  # the first call resolved it; the next two used it
        module.to(torch.bfloat16)(x.bfloat16())  # another dtype
        module(torch.randn(1, seq + 1, 32, dtype=torch.bfloat16))  # another length: diff's rule reads it
        assert calls.count("auto") == (3 if kind == "diff" else 2), kind


def test_cpuinfo_is_read_once_per_process():
    """/proc/cpuinfo read and its flags parsed once, at import: `auto` and `cpu_has_amx()` reuse them."""
    script = (
        "import pathlib\n"
        "reads = []\n"
        "read_text = pathlib.Path.read_text\n"
        "def counting(self, *a, **k):\n"
        "    reads.append(str(self))\n"
        "    return read_text(self, *a, **k)\n"
        "pathlib.Path.read_text = counting\n"
        "import torch\n"
        "from ablate.core.registry import build\n"
        "from components.attention import backends\n"
        "parses = []\n"
        "flags = backends._cpu_flags\n"
        "backends._cpu_flags = lambda text: parses.append(1) or flags(text)\n"
        "for kind in ('diff', 'softmax'):\n"
        "    for width in (8, 16):\n"
        "        m = build('attention', kind, d_model=32, head_dim=width, layer_idx=0, n_layers=1, backend='auto')\n"
        "        m.to(torch.bfloat16)(torch.randn(1, 8, 32, dtype=torch.bfloat16))\n"
        "        backends.resolve('auto', torch.device('cpu'), torch.bfloat16, diff=True, head_dim=width)\n"
        "        backends.cpu_has_amx()\n"
        "print(reads.count('/proc/cpuinfo'), len(parses))\n"
    )
    assert printed(script) == ["1", "0"]  # read and parsed at import; neither again per call


def test_unknown_backend():
    with pytest.raises(
        UserError, match=r"backend: unknown attention backend 'flsh_attn' \(did you mean 'flash_attn'\?\)"
    ):
        backends.check_backend("flsh_attn")


@pytest.mark.parametrize("backend", ON_CPU)
@pytest.mark.parametrize("kv_heads", [6, 2, 1])
def test_attend(fake_flash, backend, kv_heads):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 6, 9, 8), torch.randn(2, kv_heads, 9, 8), torch.randn(2, kv_heads, 9, 8)
    maps, expected = softmax64(q, k, v)
    assert rel(backends.attend(q, k, v, backend=backend), expected) < 1e-6
    out, weights = backends.attend(q, k, v, backend=backend, return_weights=True)
    assert rel(out, expected) < 1e-6 and rel(weights, maps) < 1e-6
    assert len(fake_flash) == (backend == "flash_attn")


@pytest.mark.parametrize("backend", ON_CPU)
@pytest.mark.parametrize("kv_heads", [3, 1])
def test_diff_attend(fake_flash, backend, kv_heads):
    """Eq. 1 with Q1 of head i against K1 of group i // (h / h_kv), Q2 against K2 of that group."""
    torch.manual_seed(0)
    h, d = 3, 4
    q1, q2 = torch.randn(2, h, 9, d), torch.randn(2, h, 9, d)
    k1, k2 = torch.randn(2, kv_heads, 9, d), torch.randn(2, kv_heads, 9, d)
    v = torch.randn(2, kv_heads, 9, 2 * d)
    lam = torch.tensor(0.37)
    a1, _ = softmax64(q1, k1, v)
    a2, _ = softmax64(q2, k2, v)
    expected = torch.einsum("bhij,bhje->bhie", a1 - 0.37 * a2, v.double().repeat_interleave(h // kv_heads, 1))
    out = backends.diff_attend(q1, q2, k1, k2, v, lam, backend=backend)
    assert out.shape == (2, h, 9, 2 * d)
    assert rel(out, expected) < 1e-6
    if backend == "flash_attn":  # FlashDiffAttn_2 with Q1|Q2 stacked: one call per V half, equal widths
        assert [(c["q"], c["k"]) for c in fake_flash] == [((2, 9, 2 * h, d), (2, 9, 2 * kv_heads, d))] * 2
    else:
        assert not fake_flash


def sdpa_ops(fn) -> dict[str, int]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key: e.count for e in prof.key_averages() if "scaled_dot_product" in e.key}


def test_profiler_tells_the_kernels_apart():
    """The detector used below can fail: a V wider than Q/K runs SDPA's math kernel."""
    q, k, v = torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 8)
    assert MATH in sdpa_ops(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert FUSED_CPU in sdpa_ops(lambda: F.scaled_dot_product_attention(q, k, v[..., :4], is_causal=True))


@pytest.mark.parametrize("n_kv_heads", [None, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize(
    "kind, backend, calls",
    [
        ("softmax", "sdpa", 1),
        ("diff", "sdpa", 2),  # split V: one call per V half
        ("diff", "sdpa_padded", 1),  # Q and K zero-padded to V's width 2d: both maps in one call
    ],
)
def test_sdpa_runs_the_fused_cpu_kernel(kind, backend, calls, n_kv_heads):
    module = build(
        "attention",
        {"name": kind, "n_kv_heads": n_kv_heads},
        d_model=64,
        head_dim=8,
        layer_idx=0,
        n_layers=1,
        backend=backend,
    )
    x = torch.randn(2, 16, 64, requires_grad=True)
    ops = sdpa_ops(lambda: module(x).sum().backward())
    assert MATH not in ops, ops
    assert ops.get(FUSED_CPU) == calls
    assert ops.get(FUSED_CPU + "_backward") == calls


def test_core_shape_errors():
    q = torch.randn(1, 4, 5, 8)
    with pytest.raises(ValueError, match="do not divide"):
        backends.attend(q, torch.randn(1, 3, 5, 8), torch.randn(1, 3, 5, 8), backend="math")
    with pytest.raises(ValueError, match="do not fit"):
        backends.diff_attend(q, q, q, q, torch.randn(1, 4, 5, 8), torch.tensor(0.5), backend="math")


class CountingFinder:
    """A meta-path finder that counts the lookups of `flash_attn` (each `import flash_attn` that is not
    already in sys.modules asks it) and finds nothing itself."""

    def __init__(self):
        self.lookups = 0

    def find_spec(self, name, path=None, target=None):
        self.lookups += name.split(".")[0] == "flash_attn"
        return None


def test_flash_attn_is_probed_once_at_import():
    script = (
        "import sys\n"
        "class CountingFinder:\n"
        "    lookups = 0\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        self.lookups += name.split('.')[0] == 'flash_attn'\n"
        "finder = CountingFinder()\n"
        "sys.meta_path.insert(0, finder)\n"
        "import torch\n"
        "from components.attention import backends\n"
        "after_import = finder.lookups\n"
        "for _ in range(3):\n"
        "    backends.resolve('auto', torch.device('cuda'), torch.bfloat16, diff=True)\n"
        "print(after_import, finder.lookups)\n"
    )
    assert printed(script) == ["1", "1"]  # one lookup, at import; none per call


def test_flash_attn_probe_is_not_called_under_compile(monkeypatch):
    """The CUDA bf16 branch of `auto` and a softmax core, compiled whole (fullgraph: no graph break), with
    every probe and every lookup of flash_attn counted: none inside the compiled region."""
    finder = CountingFinder()
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    probes = []
    probe = sdpa._probe_flash_attn
    monkeypatch.setattr(sdpa, "_probe_flash_attn", lambda: probes.append(1) or probe())
    monkeypatch.setattr(sdpa, "FLASH_ATTN", None)  # not installed: the import that used to fail per call

    def step(q, k, v):
        name = backends.resolve("auto", CUDA, torch.bfloat16, diff=True)
        scale = 1.0 if name == "sdpa_flash" else 2.0
        return scale * backends.attend(q, k, v, backend="auto")

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="eager", fullgraph=True)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 8, 8, generator=gen) for _ in range(3))
    out = compiled(q, k, v)
    assert probes == [] and finder.lookups == 0
    assert rel(out, softmax64(q, k, v)[1]) < 1e-5  # sdpa_flash chosen: the scale stayed 1
    torch._dynamo.reset()
