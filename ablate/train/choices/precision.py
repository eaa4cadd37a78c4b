"""`auto` precision on a CPU decided by the thing it decides: one whole training step of the run's own
model (its step as `ablate.train.choices.timed_step` builds it: forward, backward, clipping, the run's AdamW and
schedule, compiled where the run compiles) timed in float32 and under bf16 autocast, the faster kept.

A square matmul (`ablate.hardware.precision.measured_rates`) says how fast the CPU multiplies in bf16, not
how fast a step trains: on an Intel Xeon with AMX the matmul chose bf16 for the `cpu` width, whose whole
step was no faster (18,996 against 19,262 tokens/s in float32; `benchmarks/NOTES.md`). Only where the CPU
claims native bf16 (`ablate.hardware.precision.native_bf16`) is anything timed; elsewhere, on CUDA, for
explicit precisions and under `ABLATE_NATIVE_BF16`, `choose_precision`'s rule answers unchanged.

The timings are measured once per machine (`machine_key`) and step shape (the model's widths, depth,
attention, sequence length and micro-batch) and cached beside the matmul rates, in the user's cache
directory (`cache_dir()`: `step_precision.json`); the reason (a run's `ablate.precision_reason` tag, and
`ablate bench`'s printout) names both timings. `timer` is the seam: tests inject timings, and the real one
(`time_step`) runs here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import astuple
from pathlib import Path
from typing import Any

import torch

from ablate.core import json_cache
from ablate.hardware.device import CpuOps
from ablate.hardware.precision import (
    AUTO,
    ENV,
    cache_dir,
    choose_precision,
    device_type,
    machine_key,
    native_bf16,
)
from ablate.model.config import ModelConfig
from ablate.train.config import TrainConfig

CANDIDATES = ("32-true", "bf16-mixed")
STEP_REPEATS = 3  # timed steps per candidate (the fastest counts), after one warm-up step
MAX_TOKENS = 8192  # the timed step's tokens at most: a short run's measurement stays short

# (model, the run's `train:` as it trains, precision) -> seconds of one training step
StepTimer = Callable[[ModelConfig, TrainConfig, str], float]


def time_step(model: ModelConfig, train: TrainConfig, precision: str) -> float:
    """Seconds of one training step of the run (`model`, `train`: ablate.train.choices.timed_step) on the CPU in
    `precision`: the fastest of `STEP_REPEATS` after a warm-up step, on random tokens (at most `MAX_TOKENS`
    a step)."""
    from ablate.train.choices.timed_step import build_step, train_step

    batch = max(1, min(train.micro_batch_size, MAX_TOKENS // train.seq_len))
    step = build_step(model, train, precision, CpuOps(), batch=batch)
    train_step(step)
    return min(train_step(step)[0] for _ in range(STEP_REPEATS))


def shape_key(model: ModelConfig, seq_len: int, micro_batch: int) -> str:
    """What a step's time depends on beside the machine: the model's fields, the sequence and batch."""
    return f"{astuple(model)}|seq={seq_len}|batch={micro_batch}"


def compiled_key(train: TrainConfig) -> str:
    """A compiled step's timings are kept apart from the eager step's (eager keys as before)."""
    return "|compile" if train.compile is True else ""


def step_timings(
    model: ModelConfig,
    train: TrainConfig,
    *,
    timer: StepTimer = time_step,
    folder: Path | None = None,
) -> dict[str, float]:
    """{precision: seconds of one step} for `CANDIDATES`, measured once per machine and shape and cached
    in `folder` (default `cache_dir()`) as `step_precision.json` (ablate.core.json_cache: a damaged
    cache, or an entry without both timings, is measured again)."""
    timings, _ = json_cache.measured_once(
        (folder or cache_dir()) / "step_precision.json",
        f"{machine_key()}|{shape_key(model, train.seq_len, train.micro_batch_size)}{compiled_key(train)}",
        lambda: {p: float(timer(model, train, p)) for p in CANDIDATES},
        lambda entry: json_cache.numbers(entry, CANDIDATES),
    )
    return timings


def choose_step_precision(
    requested: str,
    device: str | torch.device,
    model: ModelConfig | None,
    train: TrainConfig | None,
    *,
    key: str = "precision",
    timer: StepTimer = time_step,
    folder: Path | None = None,
    environ: Mapping[str, str] | None = None,
    **capability: Any,
) -> tuple[str, str, dict[str, float]]:
    """(Lightning precision, reason, the step timings it chose by: {} where nothing was timed). `auto` on
    a CPU that claims native bf16: the faster whole step of the run (`model`, `train` as it trains:
    compiled only where `train.compile` is true); everything else, and a call without a model:
    `choose_precision`. `capability`: `native_bf16`'s inputs (tests pass both kinds of CPU)."""
    environ = os.environ if environ is None else environ
    forced = environ.get(ENV, "").strip() in ("0", "1")
    if requested != AUTO or device_type(device) != "cpu" or forced or model is None or train is None:
        return (*choose_precision(requested, device, key=key, environ=environ, **capability), {})
    native, why = native_bf16(device, environ=environ, **capability)
    if not native:
        return (*choose_precision(requested, device, key=key, environ=environ, **capability), {})
    timings = step_timings(model, train, timer=timer, folder=folder)
    chosen = min(CANDIDATES, key=lambda p: timings[p])  # a tie keeps float32, the first
    measured = ", ".join(f"{p} {timings[p] * 1e3:.1f} ms" for p in CANDIDATES)
    return (
        chosen,
        (
            f"{why}; measured one training step ({train.seq_len} x {train.micro_batch_size}, "
            f"{torch.get_num_threads()} threads): "
            f"{measured}: {'bf16' if chosen == 'bf16-mixed' else 'float32'} is faster"
        ),
        timings,
    )
