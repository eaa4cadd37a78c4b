"""One optimisation at a time: training-step time of the `small` Table 6 model with parts of the fast
attention path switched back to their plain form, every arm interleaved in one process.

    python benchmarks/attention_ablations.py [--seq-len 1024] [--tokens-per-step 4096] [--rounds 5] [--arms ...]

Arms (each a whole model; the ratio column is against `transformer`, measured in the same run). Each
switches parts of the shipped code back to a plainer form, to measure what each part is worth:
  transformer               softmax attention as shipped (backend auto = sdpa)
  transformer_plain         ... RoPE and RMSNorm as chains of autograd operations (the first implementation)
  transformer_fused_qkv     ... one GEMM against the Q/K/V weights concatenated (tried, not shipped)
  transformer_blockwise     ... backend blockwise (SDPA forward, backward in query blocks)
  diff_before               diff: plain RoPE/RMSNorm, the per-head norm as the RMSNorm module, split-V SDPA
  diff_head_norm            + the per-head norm as one autograd function (rms_norm with its factor)
  diff_rope_norm            + RoPE and the pre-norms as autograd functions
  diff_padded               + backend sdpa_padded (Q/K zero-padded to 2d, one fused call per layer)
  diff                      + backend blockwise (padded SDPA forward; backward in query blocks): as shipped
  diff_fused_qkv            ... one GEMM against the Q/K/V weights concatenated (tried, not shipped)
  diff_math                 backend math (N x N maps; for scale)
With --compile every arm also runs as `<arm>+compile` (the whole model in torch.compile, as
`train.compile` does). Writes nothing; prints a table (benchmarks/NOTES.md quotes it).
"""

from __future__ import annotations

import argparse
import statistics
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

from ablate.bench.measure import Arm, ForeignCpu, forward_step, timed, train_step, undisturbed
from ablate.hardware.allocator import tune_glibc_malloc
from ablate.hardware.device import CpuOps
from ablate.model.decoder import build_model
from ablate.recipe.loading import load_recipe
from ablate.train.choices.timed_step import TimedStep
from ablate.train.optimizer import for_run
from components.attention import backends
from components.attention.diff import DiffAttention
from components.attention.softmax import SoftmaxAttention
from components.norm import RMSNorm
from components.position import RoPE, _swap

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "table6.yaml"
PLAIN, FUSED_QKV, MODULE_HEAD_NORM = "plain rope and norms", "fused qkv", "module head norm"
ARMS = {
    # name: (variant, backend, patches)
    "transformer": ("transformer", "auto", ()),
    "transformer_plain": ("transformer", "auto", (PLAIN,)),
    "transformer_fused_qkv": ("transformer", "auto", (FUSED_QKV,)),
    "transformer_blockwise": ("transformer", "blockwise", ()),
    "diff_before": ("diff", "sdpa", (PLAIN, MODULE_HEAD_NORM)),
    "diff_head_norm": ("diff", "sdpa", (PLAIN,)),
    "diff_rope_norm": ("diff", "sdpa", ()),
    "diff_padded": ("diff", "sdpa_padded", ()),
    "diff": ("diff", "auto", ()),
    "diff_fused_qkv": ("diff", "auto", (FUSED_QKV,)),
    "diff_math": ("diff", "math", ()),
}
DEFAULT_ARMS = [a for a in ARMS if a != "diff_math"]


def plain_rope(self: RoPE, x: torch.Tensor) -> torch.Tensor:
    cos, signed_sin = self._cos_sin(x.shape[-2], x.device, x.dtype)
    return x * cos + _swap(x, self.style) * signed_sin


def plain_rms_norm(self: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
    return (normed * self.weight.float()).to(x.dtype)


def fused_qkv_softmax(self: SoftmaxAttention, x: torch.Tensor):
    heads, kv, width = self.n_heads, self.n_kv_heads, self.head_width
    weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
    y = F.linear(x, weight).unflatten(-1, (heads + 2 * kv, width)).transpose(1, 2)
    qk, v = y.split([heads + kv, kv], dim=1)  # split: its backward is one cat
    q, k = self.position(qk).split([heads, kv], dim=1)
    return q, k, v


def fused_qkv_diff(self: DiffAttention, x: torch.Tensor):
    d, h, h_kv = self.head_dim, self.n_heads, self.n_kv_heads
    weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
    qk, v = F.linear(x, weight).split([2 * (h + h_kv) * d, 2 * h_kv * d], dim=-1)
    q, k = self.position(qk.unflatten(-1, (2 * (h + h_kv), d)).transpose(1, 2)).split(
        [2 * h, 2 * h_kv], dim=1
    )
    q, k = q.unflatten(1, (h, 2)).transpose(1, 2), k.unflatten(1, (h_kv, 2)).transpose(1, 2)
    return q, k, v.unflatten(-1, (h_kv, 2 * d)).transpose(1, 2)


def module_norm_forward(self: DiffAttention, x: torch.Tensor) -> torch.Tensor:
    """DiffAttention.forward with the norm as `subln` (the RMSNorm module) followed by the factor."""
    batch, n, _ = x.shape
    q, k, v = self.project(x)
    out = backends.diff_attend_maps(q, k, v, self.lambda_value(), backend=self.backend)
    out = self.subln(out) * (1 - self.lambda_init)
    return self.out_proj(out.transpose(1, 2).reshape(batch, n, -1))


def build_arm(name: str, seq_len: int, batch: int):
    compiled = name.endswith("+compile")
    variant, backend, patches = ARMS[name.removesuffix("+compile")]
    run = load_recipe(RECIPE).resolve("small", seeds=[0], variants=[variant])[0]
    config = dict(run.config["model"], attention_backend=backend)
    model = build_model(config, seed=0)
    for module in model.modules():  # instance attributes: the classes stay as shipped
        if PLAIN in patches and isinstance(module, RoPE):
            module.forward = types.MethodType(plain_rope, module)
        if PLAIN in patches and isinstance(module, RMSNorm):
            module.forward = types.MethodType(plain_rms_norm, module)
        if FUSED_QKV in patches and isinstance(module, (SoftmaxAttention, DiffAttention)):
            fused = fused_qkv_diff if isinstance(module, DiffAttention) else fused_qkv_softmax
            module.project = types.MethodType(fused, module)
        if MODULE_HEAD_NORM in patches and isinstance(module, DiffAttention):
            module.forward = types.MethodType(module_norm_forward, module)
    optimizer, schedule = for_run(model, run.train)  # the run's AdamW and schedule
    if compiled:  # as `train.compile` does: the whole model
        model = torch.compile(model)
    tokens = torch.randint(
        0, config["vocab_size"], (batch, seq_len + 1), generator=torch.Generator().manual_seed(0)
    )
    step = TimedStep(model, optimizer, schedule, tokens, "bf16-mixed", CpuOps(), run.train.grad_clip)
    return Arm(name, seq_len, step, flops_per_token=0.0)  # FLOPs: not reported here


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--tokens-per-step", type=int, default=4096, help="as `ablate bench` (default 4096)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--arms", nargs="+", default=DEFAULT_ARMS, choices=list(ARMS))
    parser.add_argument("--no-malloc-tuning", action="store_true")
    parser.add_argument("--compile", action="store_true", help="add a torch.compile'd copy of every arm")
    parser.add_argument("--retries", type=int, default=3, help="retake a timing disturbed by other processes")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    malloc = "malloc defaults" if args.no_malloc_tuning else tune_glibc_malloc()
    names = args.arms + ([f"{a}+compile" for a in args.arms] if args.compile else [])
    batch = max(1, args.tokens_per_step // args.seq_len)
    arms = {name: build_arm(name, args.seq_len, batch) for name in names}
    for name, arm in arms.items():
        start = time.perf_counter()
        train_step(arm)  # warm-up (and compilation)
        forward_step(arm)
        if name.endswith("+compile"):
            print(f"{name}: compiled and warmed up in {time.perf_counter() - start:.0f} s", flush=True)
    train = {name: [] for name in arms}
    fwd = {name: [] for name in arms}
    foreign = ForeignCpu()
    repeated = 0
    for _ in range(args.rounds):
        for name, arm in arms.items():
            for step, times in ((train_step, train), (forward_step, fwd)):
                seconds, again = undisturbed(lambda s=step, a=arm: timed(s, a), args.retries)
                times[name].append(seconds)
                repeated += again
    reference = "transformer" if "transformer" in arms else args.arms[0]
    t_ref, f_ref = statistics.median(train[reference]), statistics.median(fwd[reference])
    print(
        f"N = {args.seq_len}, batch {batch}, {torch.get_num_threads()} threads, {args.rounds} rounds, {malloc}; "
        f"other processes used {foreign.fraction():.1%} of the CPU meanwhile ({repeated} timings retaken)"
    )
    print(f"{'arm':30s} {'train s':>8s} {'min':>7s} {'ratio':>6s} {'fwd s':>7s} {'ratio':>6s}")
    for name in arms:
        t, f = statistics.median(train[name]), statistics.median(fwd[name])
        print(f"{name:30s} {t:8.3f} {min(train[name]):7.3f} {t_ref / t:6.3f} {f:7.3f} {f_ref / f:6.3f}")


if __name__ == "__main__":
    main()
