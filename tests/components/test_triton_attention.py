"""The `triton` backend's kernels (components/attention/triton/kernels.py) on CPU tensors, run by Triton's
interpreter, against float64 formulas written here: outputs, both maps' log-sum-exp and every gradient,
causal, grouped-query, sequences that end inside a tile, widths 16-128 (and one that is not a power of
two), float32 / float16 / bfloat16 each with its tolerance; both backward paths (the single pass with dQ
by atomics, the two kernels of the deterministic path); the per-head norm fused into the forward, its
weight's gradient too; wrong formulas (λ's sign, the norm's factor) failing the same checks; the diff
component's fused norm against the unfused one; the custom op under torch.compile (a model in one graph,
no break); the kernels compiled for a GPU target; the line a missing triton gives.

The kernels choose the interpreter per launch for CPU tensors (no TRITON_INTERPRET needed, which would
have to be set before anything imports triton: Lightning does), so these tests run the kernels as
`ablate train` on a CPU does. Tiles of 16 rows (`BLOCK`) make every size here cross several tiles.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from ablate.core.errors import UserError
from ablate.core.registry import build
from ablate.model.decoder import build_model
from components.attention import backends
from components.attention.triton import op as triton_op
from components.norm import rms_norm

pytest.importorskip("triton")

BLOCK = 16
# Relative error (Frobenius) allowed against float64 on the same rounded inputs: float32 accumulates
# in float32 throughout; float16 and bfloat16 round the maps (and dS) to the input type before the
# products with V, Q and K, as FlashAttention does: 2^-11 and 2^-8 relative steps.
TOLERANCE = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2.5e-2}


def causal_softmax64(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) with keys after the query masked; q (..., N, d), k (..., N, d), float64."""
    n, d = q.shape[-2:]
    scores = torch.einsum("...id,...jd->...ij", q, k) / math.sqrt(d)
    later = torch.arange(n)[None, :] > torch.arange(n)[:, None]
    return scores.masked_fill(later, float("-inf")).softmax(-1)


def diff64(q1, q2, k1, k2, v, lam):
    """Eq. 1 in float64, head by head: head i reads kv group i // (h / h_kv) for K1, K2 and V."""
    heads, groups = q1.shape[1], k1.shape[1]
    outs = []
    for i in range(heads):
        g = i // (heads // groups)
        a1 = causal_softmax64(q1[:, i].double(), k1[:, g].double())
        a2 = causal_softmax64(q2[:, i].double(), k2[:, g].double())
        outs.append((a1 - lam.double() * a2) @ v[:, g].double())
    return torch.stack(outs, dim=1)


def lse64(q, k):
    """Each query's log Σ_j≤i exp(q·k_j / sqrt(d)) in float64, (B, h, N); k (B, h_kv, N, d)."""
    heads, groups = q.shape[1], k.shape[1]
    n, d = q.shape[-2:]
    later = torch.arange(n)[None, :] > torch.arange(n)[:, None]
    out = []
    for i in range(heads):
        scores = q[:, i].double() @ k[:, i // (heads // groups)].double().transpose(-1, -2) / math.sqrt(d)
        out.append(scores.masked_fill(later, float("-inf")).logsumexp(-1))
    return torch.stack(out, dim=1)


def rel(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.double() - expected).norm() / expected.norm()).item()


def projected(batch, heads, kv_heads, n, d, dtype, gen):
    """q (B,2,h,N,d), k (B,2,h_kv,N,d), v (B,h_kv,N,2d) as the `diff` component makes them: views of
    (B, N, sub-heads, d) projections with the pairs interleaved (strided, not contiguous)."""
    q = torch.randn(batch, n, 2 * heads, d, generator=gen).to(dtype)
    k = torch.randn(batch, n, 2 * kv_heads, d, generator=gen).to(dtype)
    v = torch.randn(batch, n, kv_heads, 2 * d, generator=gen).to(dtype)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    q5 = q.transpose(1, 2).unflatten(1, (heads, 2)).transpose(1, 2)
    k5 = k.transpose(1, 2).unflatten(1, (kv_heads, 2)).transpose(1, 2)
    return (q, k, v), (q5, k5, v.transpose(1, 2))


CASES = [  # batch, heads, kv heads, sequence, sub-head width
    (2, 2, 2, 37, 16),  # 3 tiles, the last 5 rows long
    (1, 4, 2, 50, 32),  # grouped: two query heads per kv head
    (1, 3, 1, 33, 24),  # one kv head for three; a width that is not a power of two (masked to 32)
    (1, 2, 1, 20, 64),
    (1, 1, 1, 17, 128),  # V 256 wide, the widest allowed
]


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=lambda t: str(t).removeprefix("torch."))
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}h{}kv{}n{}d{}".format(*c))
def test_diff_kernel_against_float64(case, dtype):
    """The single-pass backward (dQ added by atomics) and the forward."""
    check_diff_kernel(case, dtype, BLOCK, BLOCK)


@pytest.mark.parametrize(
    "case, dtype",
    [
        ((2, 2, 2, 37, 16), torch.float32),  # MHA, a masked tail
        ((1, 4, 2, 50, 32), torch.bfloat16),  # grouped
        ((1, 3, 1, 33, 24), torch.float16),  # one kv head for three, a width that is masked
    ],
    ids=lambda c: str(c).removeprefix("torch."),
)
def test_deterministic_backward_against_float64(case, dtype):
    """The two-kernel backward (dK and dV per key block, dQ per query block: no atomics)."""
    check_diff_kernel(case, dtype, BLOCK, BLOCK, deterministic=True)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16], ids=lambda t: str(t).removeprefix("torch.")
)
@pytest.mark.parametrize("block_m, block_n", [(32, 16), (16, 32)])
def test_diff_kernel_with_unequal_tiles(block_m, block_n, dtype):
    """Query tiles taller than key tiles (the forward's first candidate in 16 bits on CUDA:
    triton/configs.py: `candidates`) and shorter: the causal bounds of each kernel's loop meet the other
    tile's edges inside a tile, and the tiles seen whole meet the masked ones there (both backward
    paths)."""
    check_diff_kernel((1, 4, 2, 50, 32), dtype, block_m, block_n)
    check_diff_kernel((1, 2, 1, 50, 16), dtype, block_m, block_n, deterministic=True)


@pytest.mark.parametrize("growth", [0.3, 1.0])
def test_scores_rising_along_the_keys(growth):
    """The forward moves a map's running maximum only when some row's grows by more than 8 in base 2
    (forward.py: `_softmax_pv`): scores that rise by `growth` per key (about 7 or 23 in base 2 per tile
    of 16 keys) take the branch on some tiles and keep the stale maximum on others; output, log-sum-exp
    and gradients against float64."""
    gen = torch.Generator().manual_seed(11)
    batch, heads, n, d = 1, 2, 50, 16
    direction = torch.randn(d, generator=gen)
    direction = direction / direction.norm()
    ramp = growth * torch.arange(n, dtype=torch.float32)[:, None] * direction  # score q·k_j/√d ≈ growth j
    q = (0.3 * torch.randn(batch, 2, heads, n, d, generator=gen) + math.sqrt(d) * direction).requires_grad_()
    k = (0.3 * torch.randn(batch, 2, heads, n, d, generator=gen) + ramp).requires_grad_()
    v = torch.randn(batch, heads, n, 2 * d, generator=gen).requires_grad_()
    lam = torch.tensor(0.63, requires_grad=True)
    out, _, lse, *_ = torch.ops.ablate.triton_attention(q, k, v, lam, BLOCK, BLOCK)
    grad = torch.randn(out.shape, generator=gen)
    out.backward(grad)
    ref = [t.detach().double().requires_grad_() for t in (q, k, v, lam)]
    expected = diff64(ref[0][:, 0], ref[0][:, 1], ref[1][:, 0], ref[1][:, 1], ref[2], ref[3])
    expected.backward(grad.double())
    tol = TOLERANCE[torch.float32]
    assert rel(out, expected.detach()) < tol
    for m in range(2):
        assert rel(lse[:, m], lse64(ref[0][:, m], ref[1][:, m])) < 1e-6
    for name, actual, wanted in [("dQ", q, ref[0]), ("dK", k, ref[1]), ("dV", v, ref[2])]:
        assert rel(actual.grad, wanted.grad) < tol, name


def test_a_wrong_formula_fails_the_check():
    """Broken on purpose: against Eq. 1 with λ's sign flipped, the same comparison fails, for the
    output and for the gradients λ reaches."""
    errors = diff_kernel_errors((1, 4, 2, 50, 32), torch.float32, BLOCK, BLOCK, lam_sign=-1.0)
    tol = TOLERANCE[torch.float32]
    assert errors["lse1"] < 1e-6 and errors["lse2"] < 1e-6  # λ plays no part in the maps' statistics
    # dQ1 and dK1 do not depend on λ (δ1 = rowsum(dO · A1 V)): they still match.
    assert {name for name, error in errors.items() if error > tol} == {"out", "dQ2", "dK2", "dV", "dλ"}


def test_deterministic_algorithms_choose_the_two_kernel_backward():
    """`torch.use_deterministic_algorithms(True)` (what `train.deterministic` sets) picks the two-kernel
    backward: its gradients bit for bit, which the single pass's float32 atomics do not give."""
    gen = torch.Generator().manual_seed(7)
    _, (q, k, v) = projected(1, 2, 1, 40, 24, torch.float32, gen)
    lam = torch.tensor(0.5, requires_grad=True)
    grad = torch.randn(1, 2, 40, 48, generator=gen)

    def grads(*deterministic):
        out = torch.ops.ablate.triton_attention(q, k, v, lam, BLOCK, BLOCK, *deterministic)[0]
        return torch.autograd.grad(out, (q, k, v, lam), grad)

    single_pass, two_kernels = grads(False), grads(True)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        chosen = grads()
    finally:
        torch.use_deterministic_algorithms(previous)
    assert all(torch.equal(a, b) for a, b in zip(chosen, two_kernels))
    assert not torch.equal(single_pass[0], two_kernels[0])  # dQ: scaled per tile, then summed


def check_diff_kernel(case, dtype, block_m: int, block_n: int, *, deterministic: bool = False) -> None:
    errors = diff_kernel_errors(case, dtype, block_m, block_n, deterministic=deterministic)
    tol = TOLERANCE[dtype]
    for name, error in errors.items():
        assert error < (1e-6 if name.startswith("lse") else tol), (name, error)


def diff_kernel_errors(
    case,
    dtype,
    block_m: int,
    block_n: int,
    *,
    deterministic: bool = False,
    lam_sign: float = 1.0,
    norm: tuple[float, float] | None = None,
    norm_scale: float = 1.0,
    misaligned: bool = False,
) -> dict[str, float]:
    """Relative errors of the op's outputs and gradients against Eq. 1 in float64 (with λ times
    `lam_sign`: -1 is a wrong formula). `norm` = (eps, factor): the kernel applies Eq. 3's RMSNorm times
    the factor with a random weight, the formula with the factor times `norm_scale` (not 1: wrong).
    `misaligned`: q, k and v start one element past a 16-byte boundary (the op's pointer loads)."""
    batch, heads, kv_heads, n, d = case
    gen = torch.Generator().manual_seed(sum(case))
    leaves, (q, k, v) = projected(batch, heads, kv_heads, n, d, dtype, gen)
    if misaligned:
        q, k, v = (off_by_one(t) for t in (q, k, v))
        assert not triton_op.tma_loads(q) and not triton_op.tma_loads(k) and not triton_op.tma_loads(v)
    lam = torch.tensor(0.63, requires_grad=True)
    weight = (1 + 0.3 * torch.randn(2 * d, generator=gen)).requires_grad_()
    normed = (weight, *norm) if norm else (None, 0.0, 1.0)
    out, o2, lse, *_ = torch.ops.ablate.triton_attention(
        q, k, v, lam, block_m, block_n, deterministic, *normed
    )
    grad = torch.randn(out.shape, generator=gen).to(dtype)
    out.backward(grad)

    ref = [t.detach().double().requires_grad_() for t in (q[:, 0], q[:, 1], k[:, 0], k[:, 1], v, lam, weight)]
    expected = diff64(*ref[:5], lam_sign * ref[5])
    if norm:
        expected = rms_norm64(expected, ref[6], norm[0], norm[1] * norm_scale)
    expected.backward(grad.double())
    assert out.shape == (batch, heads, n, 2 * d) and out.dtype == dtype
    a2v = diff64(ref[1], ref[1], ref[3], ref[3], ref[4], torch.tensor(0.0)).detach()  # A2 V, kept for dλ
    dq = leaves[0].grad.unflatten(2, (heads, 2))  # (B, N, h, 2, d): map c of head i
    dk = leaves[1].grad.unflatten(2, (kv_heads, 2))
    errors = {
        "out": rel(out, expected.detach()),
        "lse1": rel(lse[:, 0], lse64(ref[0], ref[2])),
        "lse2": rel(lse[:, 1], lse64(ref[1], ref[3])),
        "o2": rel(o2, a2v),
    }
    for name, actual, wanted in [
        ("dQ1", dq[:, :, :, 0].transpose(1, 2), ref[0].grad),
        ("dQ2", dq[:, :, :, 1].transpose(1, 2), ref[1].grad),
        ("dK1", dk[:, :, :, 0].transpose(1, 2), ref[2].grad),
        ("dK2", dk[:, :, :, 1].transpose(1, 2), ref[3].grad),
        ("dV", leaves[2].grad.transpose(1, 2), ref[4].grad),
    ]:
        assert actual.dtype == dtype, name
        errors[name] = rel(actual, wanted)
    errors["dλ"] = abs(lam.grad.item() - ref[5].grad.item()) / abs(ref[5].grad.item())
    if norm:
        errors["dW"] = rel(weight.grad, ref[6].grad)
    return errors


def off_by_one(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values (and its gradient's path) in a contiguous tensor that starts one element after a
    16-byte boundary."""
    return torch.empty(t.numel() + 1, dtype=t.dtype)[1:].view(t.shape).copy_(t)


def test_tile_loads_by_descriptor_only_where_the_copy_engine_can():
    """TMA (tensor descriptors) needs each tensor's last dimension contiguous and its start and other
    strides 16-byte aligned (triton/op.py: `tma_loads`); anything else takes the pointer loads."""
    gen = torch.Generator().manual_seed(3)
    _, (q, k, v) = projected(1, 2, 1, 20, 16, torch.bfloat16, gen)  # the model's strided views
    assert triton_op.tma_loads(q, k, v)
    assert not triton_op.tma_loads(q, k, v.transpose(-1, -2))  # last dimension not contiguous
    assert not triton_op.tma_loads(off_by_one(q))  # start 2 bytes past a boundary
    assert not triton_op.tma_loads(torch.zeros(1, 2, 1, 20, 20, dtype=torch.bfloat16))  # rows 40 bytes apart
    assert triton_op.tma_loads(torch.zeros(1, 2, 1, 20, 24, dtype=torch.bfloat16))  # 48 bytes


@pytest.mark.parametrize(
    "dtype, deterministic",
    [(torch.bfloat16, False), (torch.float16, True)],
    ids=["bfloat16-single_pass", "float16-two_kernels"],
)
def test_pointer_loads_against_float64(dtype, deterministic):
    """Inputs the copy engine cannot read (misaligned by one element): the forward and each backward
    path load their tiles by pointers, against the same float64 formulas (the other tests' inputs in 16
    bits are aligned views: their forward's and dQ kernel's tiles come by tensor descriptors)."""
    errors = diff_kernel_errors(
        (1, 4, 2, 50, 32), dtype, BLOCK, BLOCK, deterministic=deterministic, misaligned=True
    )
    for name, error in errors.items():
        assert error < (1e-6 if name.startswith("lse") else TOLERANCE[dtype]), (name, error)


def rms_norm64(o: torch.Tensor, weight: torch.Tensor, eps: float, factor: float) -> torch.Tensor:
    """Eq. 3's per-head norm in float64: each 2d-wide row over its root mean square, times the weight and
    the factor (1 - λ_init)."""
    return o / torch.sqrt(o.square().mean(-1, keepdim=True) + eps) * weight * factor


@pytest.mark.parametrize(
    "case, dtype, deterministic",
    [
        ((2, 2, 2, 37, 16), torch.float32, False),  # MHA, a masked tail
        ((1, 4, 2, 50, 32), torch.bfloat16, True),  # grouped
        ((1, 4, 2, 50, 32), torch.bfloat16, False),
        ((1, 3, 1, 33, 24), torch.float16, False),  # one kv head for three, a width that is masked
    ],
    ids=lambda c: str(c).removeprefix("torch."),
)
def test_fused_norm_against_float64(case, dtype, deterministic):
    """Eq. 3's RMSNorm times (1 - λ_init) in the forward's epilogue, its backward in the δ kernel:
    output and every gradient (the weight's too) against the float64 formula."""
    errors = diff_kernel_errors(case, dtype, BLOCK, BLOCK, deterministic=deterministic, norm=(1e-5, 0.7))
    tol = TOLERANCE[dtype]
    for name, error in errors.items():
        assert error < (1e-6 if name.startswith("lse") else tol), (name, error)


def test_a_wrong_norm_fails_the_check():
    """Broken on purpose: against the norm without its (1 - λ_init) factor, the comparison fails for the
    output and every gradient it reaches."""
    errors = diff_kernel_errors(
        (1, 4, 2, 50, 32), torch.float32, BLOCK, BLOCK, norm=(1e-5, 0.7), norm_scale=1 / 0.7
    )
    tol = TOLERANCE[torch.float32]
    assert {name for name, error in errors.items() if error > tol} == {
        "out", "dQ1", "dQ2", "dK1", "dK2", "dV", "dλ", "dW"
    }  # fmt: skip


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=lambda t: str(t).removeprefix("torch."))
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_softmax_kernel_against_float64(kv_heads, dtype):
    """One map: the Transformer's attention by the same kernel, through `backends.attend`."""
    check_softmax_kernel(kv_heads, dtype, lambda q, k, v: backends.attend(q, k, v, backend="triton"))


@pytest.mark.parametrize("deterministic", [False, True], ids=["single_pass", "two_kernels"])
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16], ids=lambda t: str(t).removeprefix("torch.")
)
def test_softmax_kernel_in_tiles(dtype, deterministic):
    """One map in tiles of 16 (masked and whole tiles, a masked tail), both backward paths."""
    check_softmax_kernel(
        2, dtype, lambda q, k, v: triton_op.attention(q, k, v, block=BLOCK, deterministic=deterministic)
    )


def check_softmax_kernel(kv_heads, dtype, attend) -> None:
    gen = torch.Generator().manual_seed(kv_heads)
    q = torch.randn(2, 4, 41, 32, generator=gen).to(dtype).requires_grad_()
    k, v = (torch.randn(2, kv_heads, 41, 32, generator=gen).to(dtype).requires_grad_() for _ in range(2))
    out = attend(q, k, v)
    grad = torch.randn(out.shape, generator=gen).to(dtype)
    out.backward(grad)
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    repeat = 4 // kv_heads
    expected = causal_softmax64(ref[0], ref[1].repeat_interleave(repeat, 1)) @ ref[2].repeat_interleave(
        repeat, 1
    )
    expected.backward(grad.double())
    tol = TOLERANCE[dtype]
    assert rel(out, expected.detach()) < tol
    for name, actual, ref_leaf in zip(("dQ", "dK", "dV"), (q, k, v), ref):
        assert rel(actual.grad, ref_leaf.grad) < tol, name


def test_diff_component_on_triton_matches_the_paper(reference):
    """The `diff` module with `backend: triton` (the norm and (1 - λ_init) in the kernel's epilogue)
    against conftest's Eq. 1-3 in float64; its gradients against the `math` backend's."""
    kwargs = {"d_model": 64, "head_dim": 16, "layer_idx": 1, "n_layers": 2, "position": "none"}
    spec = {"name": "diff", "n_kv_heads": 1}
    fused = build("attention", spec, backend="triton", **kwargs)
    math_ = build("attention", spec, backend="math", **kwargs)
    math_.load_state_dict(fused.state_dict())
    x = torch.randn(2, 21, 64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    p = {name: t.detach().double() for name, t in fused.state_dict().items()}
    expected = reference.diff(
        x.detach().double(), p, h=2, h_kv=1, lam_init=fused.lambda_init, norm=True, rope=None
    )
    out = fused(x)
    assert rel(out, expected) < 1e-5
    out.square().sum().backward()
    math_(x).square().sum().backward()
    for (name, a), b in zip(fused.named_parameters(), math_.parameters()):
        assert a.grad.abs().sum() > 0, name
        assert rel(a.grad, b.grad.double()) < 1e-4, name


# Fused against unfused: float32 and float16 differ in the order of float32 sums (measured up to 1.5e-6
# and 4e-7); in bfloat16 the interpreter truncates the kernel's float32 to bfloat16 where PyTorch (and
# the GPU) round to nearest, a step of 2^-8 on about half the outputs (measured up to 6.6e-3).
SAME = {torch.float32: 5e-6, torch.float16: 1e-5, torch.bfloat16: 1.5e-2}


@pytest.mark.parametrize("dtype", list(SAME), ids=lambda t: str(t).removeprefix("torch."))
def test_diff_component_fuses_the_norm_on_triton(dtype):
    """On `triton` the module's per-head norm runs in the kernel: the same output and gradients (the
    norm's weight and λ's vectors included) as the same kernel with `rms_norm` applied after it."""
    kwargs = {"d_model": 64, "head_dim": 16, "layer_idx": 1, "n_layers": 2, "position": "none"}
    torch.manual_seed(0)
    module = build("attention", {"name": "diff", "n_kv_heads": 1}, backend="triton", **kwargs).to(dtype)
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        module.subln.weight.copy_(1 + 0.3 * torch.randn(32, generator=gen))
    x = torch.randn(2, 21, 64, generator=gen).to(dtype).requires_grad_()
    grad = torch.randn(2, 21, 64, generator=gen).to(dtype)
    leaves = [x, *module.parameters()]

    def unfused(x):
        q, k, v = module.project(x)
        out = triton_op.diff_attention(q, k, v, module.lambda_value())
        out = rms_norm(out, module.subln.weight, module.subln.eps, 1 - module.lambda_init)
        return module.out_proj(out.transpose(1, 2).reshape(2, 21, 64))

    fused, expected = module(x), unfused(x)
    assert rel(fused, expected.double()) < SAME[dtype]
    names = ["x", *(name for name, _ in module.named_parameters())]
    for name, a, b in zip(
        names, torch.autograd.grad(fused, leaves, grad), torch.autograd.grad(expected, leaves, grad)
    ):
        assert rel(a, b.double()) < SAME[dtype], name


def test_the_core_compiles_whole():
    """The custom op traces through its fake implementations with no graph break (fullgraph), forward
    and backward, and computes under compile what it computes eagerly."""
    gen = torch.Generator().manual_seed(2)
    leaves, (q, k, v) = projected(1, 2, 1, 24, 16, torch.float32, gen)
    lam = torch.tensor(0.4, requires_grad=True)

    def core(q, k, v, lam):
        return backends.diff_attend_maps(q, k, v, lam, backend="triton").square().sum()

    torch._dynamo.reset()
    compiled = torch.compile(core, fullgraph=True, backend="aot_eager")  # a graph break fails here
    grads = []
    for fn in (core, compiled):
        loss = fn(q, k, v, lam)
        grads.append((loss.detach(), *torch.autograd.grad(loss, (*leaves, lam))))
    torch._dynamo.reset()
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)


def test_compiled_model_runs_the_custom_op():
    """`train.compile: true` with `attention_backend: triton` (the per-head norm fused): the compiled
    model (inductor) is one graph, no break, and computes what the eager one does, gradients included."""
    config = {"vocab_size": 64, "d_model": 64, "n_layers": 2, "head_dim": 16}
    config |= {"attention": {"name": "diff"}, "attention_backend": "triton"}
    eager, source = build_model(config, seed=0), build_model(config, seed=0)
    with torch.no_grad():  # away from the zero-initialised outputs, so every gradient is non-trivial
        for a, b in zip(eager.parameters(), source.parameters()):
            a.add_(torch.randn_like(a) * 0.05)
            b.copy_(a)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(source)
    tokens = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(1))
    eager_loss = eager(tokens).float().logsumexp(-1).mean()
    compiled_loss = compiled(tokens).float().logsumexp(-1).mean()
    assert counters["stats"]["unique_graphs"] == 1 and sum(counters["graph_break"].values()) == 0
    eager_loss.backward()
    compiled_loss.backward()
    torch._dynamo.reset()
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-6)
    for (name, a), b in zip(eager.named_parameters(), source.parameters()):
        assert a.grad is not None and a.grad.abs().sum() > 0, name
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_fake_implementations_give_the_real_layouts():
    """What the compiler plans with (register_fake) is what the kernel returns: shapes, dtypes, strides."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    gen = torch.Generator().manual_seed(0)
    _, (q, k, v) = projected(1, 2, 1, 18, 16, torch.float32, gen)
    lam = torch.tensor(0.5)
    weight = torch.rand(32)
    for norm in ((), (False, weight, 1e-5, 0.7)):
        real = torch.ops.ablate.triton_attention(q, k, v, lam, BLOCK, BLOCK, *norm)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fakes = (mode.from_tensor(t) for t in (q, k, v, lam))
            fake = torch.ops.ablate.triton_attention(*fakes, BLOCK, BLOCK, *norm)
        assert len(real) == len(fake) == 5
        for r, f in zip(real, fake):
            assert (r.shape, r.dtype, r.stride()) == (f.shape, f.dtype, f.stride())


def test_the_gpu_kernels_compile():
    """The kernels as `triton.jit` compiles them for CUDA (an sm_90 target, no GPU needed: Triton's own
    compiler down to a cubin), the tile loops resolved as jit functions: Diff in bfloat16 with the norm,
    both backward paths; the single pass's dQ goes out by atomic adds, the two-kernel path's by none; the
    forward's tiles by tensor descriptors (TMA), the backward's by pointers."""
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from components.attention.triton import kernels

    fwd, delta, kv, q = kernels.kernels(False)
    pointers = dict.fromkeys(["Q", "K", "V", "OUT", "O2", "PRE", "DO", "DK", "DV", "DPRE"], "*bf16")
    pointers |= dict.fromkeys(["LSE", "LAM", "INV", "W", "DELTA", "DW", "DQ"], "*fp32")
    tiles = {"MAPS": 2, "BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_D": 32, "BLOCK_E": 64}
    tiles |= {"PRECISION": "tf32", "DOT": tl.bfloat16, "TMA": False}

    def ptx(kernel, constants, **types):
        signature = {
            name: "constexpr" if name in constants else {**pointers, **types}.get(name, "i32")
            for name in kernel.arg_names
        }
        signature |= {name: "fp32" for name in ("scale", "eps", "factor") if name in signature}
        source = ASTSource(kernel, signature, {(kernel.arg_names.index(n),): v for n, v in constants.items()})
        target = GPUTarget("cuda", 90, 32)  # sm_90, 32 threads per warp
        return compile(source, target=target, options={"num_warps": 4, "num_stages": 2}).asm["ptx"]

    ptx(fwd, tiles | {"NORM": True, "TMA": True})  # tiles by tensor descriptors; the rest by pointers
    ptx(delta, {"MAPS": 2, "NORM": True, "BLOCK_M": 32, "BLOCK_E": 64})
    adds = re.compile(r"\b(?:red|atom)\.global\.\S*add\.f32")  # float32 atomic adds to global memory
    assert adds.search(ptx(kv, tiles | {"ATOMIC": True}))
    assert not adds.search(ptx(kv, tiles | {"ATOMIC": False}))
    ptx(q, tiles, DQ="*bf16")


INTERPRETED = """
import torch
from components.attention.triton import op as triton_op
gen = torch.Generator().manual_seed(5)
q, k = torch.randn(1, 2, 2, 19, 16, generator=gen), torch.randn(1, 2, 1, 19, 16, generator=gen)
v, lam = torch.randn(1, 1, 19, 32, generator=gen), torch.tensor(0.3)
leaves = [t.requires_grad_() for t in (q, k, v, lam)]
out = triton_op.diff_attention(q, k, v, lam, block=16)
out.square().sum().backward()
torch.save([out.detach()] + [t.grad for t in leaves], PATH)
"""


def test_the_same_numbers_with_triton_interpret_set(tmp_path):
    """With TRITON_INTERPRET=1 set before triton is imported (every jit function interpreted, Triton's
    standard library too) the kernels give bitwise what they give here, where only they are interpreted."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    root = Path(__file__).resolve().parents[2]
    there, here = tmp_path / "there.pt", tmp_path / "here.pt"
    subprocess.run(
        [sys.executable, "-c", f"PATH = {str(there)!r}" + INTERPRETED], cwd=root, env=env, check=True
    )
    exec(f"PATH = {str(here)!r}" + INTERPRETED, {})
    here, there = torch.load(here), torch.load(there)
    assert len(here) == 5 and all(torch.equal(a, b) for a, b in zip(here, there))


def test_missing_triton_is_one_line(monkeypatch):
    monkeypatch.setattr(triton_op, "available", lambda: False)
    message = "attention_backend: triton needs the triton package (pip install 'ablate[triton]')"
    with pytest.raises(UserError) as e:
        backends.check_backend("triton")
    assert str(e.value) == message
    with pytest.raises(UserError, match="needs the triton package"):
        build("attention", "diff", d_model=32, head_dim=8, layer_idx=0, n_layers=1, backend="triton")


def test_too_wide_is_one_line():
    q = torch.randn(1, 1, 4, 8, 160)
    with pytest.raises(UserError, match=r"triton takes V up to 256 wide .* got 320"):
        triton_op.diff_attention(
            q.expand(1, 2, 4, 8, 160), q.expand(1, 2, 4, 8, 160), torch.randn(1, 4, 8, 320), torch.tensor(0.5)
        )


def test_auto_never_chooses_triton():
    """Opt-in until a committed device report shows it fastest."""
    for device in (torch.device("cpu"), torch.device("cuda")):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for diff in (False, True):
                for width in (16, 32, 64, 128):
                    for seq in (None, 256, 4096):
                        name = backends.resolve(
                            "auto", device, dtype, diff=diff, head_dim=width, amx=False, seq_len=seq
                        )
                        assert name != "triton"
