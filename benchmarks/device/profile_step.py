"""Part (p) of the device check: one training step of each arm (the `small` Transformer and Diff at 2,048
tokens a sequence, 16,384 a step, the recipe's backend, eager, in `auto`'s precision) under
`torch.profiler`, after warm-up steps: where the step's time goes, kernel by kernel.

`p_profile.csv`: per arm, the top kernels by their own time on the device (CUDA kernels; on a CPU, the
operators' own CPU time), with their calls, milliseconds and share of the step: their time over the
profiled step's wall time (measured around it, synchronized), and over the sum of every kernel's own
time (`share_of_kernels`: what is left of 1 in the step's share is time the device sat idle, waiting on
launches and Python). `p_steps.csv`: per arm, the step's milliseconds, the kernels' total and their
count. Written arm by arm, so a part stopped at its box keeps the arm it finished.

The model, batch and step are `ablate.bench.measure`'s (`build_arms`, `train_step`): the step `ablate bench`
times is the step profiled.
"""

from __future__ import annotations

import torch
from csv_rows import append_rows  # benchmarks/device/csv_rows.py
from runs import VARIANTS  # benchmarks/device/runs.py

TOP = 25  # kernels kept per arm
WARMUP = 3
SEQ_LEN, TOKENS = 2048, 16384
DRY = {"scale": "train-small", "seq_len": 16, "tokens": 64}
KERNEL_COLUMNS = ["variant", "rank", "kernel", "calls", "ms", "share_of_step", "share_of_kernels"]
STEP_COLUMNS = ["variant", "backend", "precision", "seq_len", "tokens", "step_ms", "kernels_ms", "kernels"]


def own_ms(event, on_cuda: bool) -> float:
    """An averaged event's own time on the device, in ms (torch names it `self_device_time_total` from
    2.4, `self_cuda_time_total` before)."""
    if not on_cuda:
        return event.self_cpu_time_total / 1e3
    own = getattr(event, "self_device_time_total", None)
    return (getattr(event, "self_cuda_time_total", 0.0) if own is None else own) / 1e3


def kernel_rows(variant: str, events, step_ms: float, on_cuda: bool) -> tuple[list[dict], float, int]:
    """The top `TOP` of the averaged events by own time; the total own time and the number of kernels."""
    if on_cuda:  # the kernels themselves (an operator's own device time would count them twice)
        events = [e for e in events if str(e.device_type).endswith("CUDA")]
    timed = [(e.key, e.count, own_ms(e, on_cuda)) for e in events]
    total = sum(ms for _, _, ms in timed)
    timed.sort(key=lambda t: -t[2])
    rows = [
        {
            "variant": variant,
            "rank": i + 1,
            "kernel": name,
            "calls": calls,
            "ms": f"{ms:.4f}",
            "share_of_step": f"{ms / step_ms:.4f}" if step_ms else "",
            "share_of_kernels": f"{ms / total:.4f}" if total else "",
        }  # fmt: skip
        for i, (name, calls, ms) in enumerate(timed[:TOP])
    ]
    return rows, total, sum(count for _, count, _ in timed)


def main(ctx) -> None:
    import ablate.bench.measure as lib
    from ablate.hardware.device import device_ops
    from ablate.hardware.precision import choose_precision
    from ablate.recipe.loading import load_recipe

    scale, seq_len, tokens = ("small", SEQ_LEN, TOKENS) if not ctx.dry else tuple(DRY.values())
    recipe_path = str(ctx.recipe) if ctx.dry else "recipes/table6.yaml"
    ops = device_ops(ctx.device)
    on_cuda = ops.device.type == "cuda"
    precision, why = choose_precision("auto", ops.device)
    print(f"precision {precision} ({why})", flush=True)
    runs = lib.bench_runs(load_recipe(recipe_path, scale=scale), list(VARIANTS), None)
    activities = [torch.profiler.ProfilerActivity.CPU]
    activities += [torch.profiler.ProfilerActivity.CUDA] if on_cuda else []
    for variant, (config, train) in runs.items():  # one model at a time: only one is in memory
        (arm,), models = lib.build_arms(
            {variant: (config, train)},
            [seq_len],
            ops,
            precision,
            compile=False,
            batch_size=None,
            tokens_per_step=tokens,
        )
        for _ in range(WARMUP):
            lib.train_step(arm)
        with torch.profiler.profile(activities=activities) as prof:
            step_s, _ = lib.train_step(arm)
        step_ms = step_s * 1e3
        rows, total, count = kernel_rows(variant, prof.key_averages(), step_ms, on_cuda)
        append_rows(ctx.out / "p_profile.csv", rows, KERNEL_COLUMNS)
        append_rows(ctx.out / "p_steps.csv", [{
            "variant": variant, "backend": config.attention_backend, "precision": precision, "seq_len": seq_len,
            "tokens": arm.n_tokens, "step_ms": f"{step_ms:.3f}", "kernels_ms": f"{total:.3f}", "kernels": count,
        }], STEP_COLUMNS)  # fmt: skip
        del arm, models
        if on_cuda:
            torch.cuda.empty_cache()
