"""Training and forward throughput, peak memory and MFU of a recipe's variants, in one run (`ablate bench`).

What is measured, per variant and sequence length (the recipe's model at `scale`; each step holds
`tokens_per_step` tokens, as max(1, tokens_per_step // seq_len) sequences, unless `batch_size` is given:
equal work per step across lengths, and matrix products as tall as training's micro-batches make them):

- where: `device` (default CUDA when present, else the CPU), in the precision `ablate.hardware.precision`'s rule
  chooses for it (`auto`: bf16 autocast where the device runs bf16 natively, float32 elsewhere; an
  explicit `precision` overrides). The choice and its reason are printed and written into bench.md.
- training throughput: the variant's run's own training step (ablate.train.choices.timed_step: forward, backward,
  gradient clipping, the run's AdamW and schedule from ablate.train.optimizer), in that precision, loss in
  float32 (as `ablate.train.module` computes it), tokens/s of wall-clock time (on CUDA, synchronised: see
  `ablate.hardware.device`).
- forward throughput: the forward alone under `torch.no_grad()`, tokens/s.
- peak memory: the peak of bytes held by PyTorch's allocator for the device during one training step,
  above what it held when the step began (parameters and optimizer state are already there; activations,
  gradients and temporaries are what grows). CPU: the allocator's own records (the profiler's memory
  events), not the process RSS; CUDA: `torch.cuda.max_memory_allocated`. One extra, untimed step per arm.
- the device's matmul peak, in the dtype the model's products ran in and in float32: square GEMMs, sizes
  doubling from small while a product stays short, within a time budget (bf16 emulated on a CPU without
  native bf16 is ~75x slower than float32: fixed large sizes took minutes there), best of every round.
- MFU: budget FLOPs per token x 3 (training) x training tokens/s / the matmul peak of the dtype that ran.
  Budget FLOPs count attention maps dense, as `ablate.model.cost` does (causal kernels execute about half of
  them). A peak below the model's own achieved FLOP rate cannot be the device's peak (the measurement
  was disturbed or too short): the MFU is then reported as suspect (NaN in the csv), not above 100%.

Arms are interleaved and repeated: every round times every (variant, seq_len) once, after one untimed
warm-up each; the tables report the median over rounds. One progress line per arm and round is printed
as it goes (tokens/s so far, time left). The machine is shared: `bench.md` records the load average
before and after.

The FLOP ceilings set beside the measured ratios are computed in `ablate.bench.ceilings`; the files
are written from the measurements by `ablate.bench.results`.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ablate.bench.defaults import (  # noqa: F401 (the bench's defaults, read through this module too)
    PEAK_BUDGET_S,
    PEAK_MAX_SIZE,
    PRECISIONS,
    STANDARD_SEQ_LENS,
    TOKENS_PER_STEP,
)
from ablate.core.errors import UserError
from ablate.core.registry import closest
from ablate.core.tables import format_seconds
from ablate.hardware.device import CpuOps, DeviceOps
from ablate.model.config import ModelConfig
from ablate.model.cost import model_cost
from ablate.train.choices import timed_step
from ablate.train.choices.timed_step import TimedStep, build_step
from ablate.train.config import TrainConfig

DISTURBED = 0.05  # share of the machine's CPU used by other processes above which a timing is retaken


class ForeignCpu:
    """CPU time other processes used while we ran: /proc/stat's busy time minus our own process time,
    as a fraction of the machine (all cores) over the wall-clock interval. NaN where /proc is missing."""

    def __init__(self) -> None:
        self.start = self._snapshot()

    @staticmethod
    def _snapshot() -> tuple[float, float, float]:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
            busy = (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError):
            busy = float("nan")
        return time.perf_counter(), busy, time.process_time()

    def fraction(self) -> float:
        wall0, busy0, own0 = self.start
        wall1, busy1, own1 = self._snapshot()
        cores = os.cpu_count() or 1
        return max(0.0, (busy1 - busy0) - (own1 - own0)) / max(1e-9, (wall1 - wall0) * cores)


@dataclass
class Arm:
    """One (variant, sequence length) of the bench: the run's step at that length (ablate.train.choices.timed_step)
    and what was measured of it."""

    variant: str
    seq_len: int
    step: TimedStep
    flops_per_token: float  # forward, budget convention
    train_s: list[float] = field(default_factory=list)
    opt_s: list[float] = field(default_factory=list)  # the optimizer's part of each training step
    fwd_s: list[float] = field(default_factory=list)
    peak_bytes: int = 0

    @property
    def n_tokens(self) -> int:
        return self.step.n_tokens


def default_seq_lens(recipe: Any) -> list[int]:
    """The standard lengths and the loaded scale's own training length (`cpu` and `tiny`: 256), so every
    scale's bench has the row its training runs at."""
    return sorted({*STANDARD_SEQ_LENS, *(run.train.seq_len for run in recipe.runs)})


def bench_runs(
    recipe: Any, variants: list[str], backend: str | None
) -> dict[str, tuple[ModelConfig, TrainConfig]]:
    """Each variant's model and `train:` sections (a recipe with a sizes axis: its first size), with
    `backend` for every arm when given: the step the variant's run takes."""
    for key in variants:
        if key not in recipe.variants:
            raise UserError(
                f"--variants: unknown variant {key!r}{closest(key, recipe.variants)}; "
                f"variants of {recipe.name}: {', '.join(recipe.variants)}"
            )
    runs: dict[str, Any] = {}
    for run in recipe.runs_for([0], variants=variants):
        runs.setdefault(run.variant, run)
    return {
        v: (
            runs[v].model if backend is None else replace(runs[v].model, attention_backend=backend),
            runs[v].train,
        )
        for v in variants
    }


def build_arms(
    runs: dict[str, tuple[ModelConfig, TrainConfig]],
    seq_lens: Sequence[int],
    ops: DeviceOps,
    precision: str,
    *,
    compile: bool,
    batch_size: int | None,
    tokens_per_step: int,
) -> tuple[list[Arm], dict[str, tuple]]:
    """One run's step per variant (its model, optimizer and schedule: ablate.train.choices.timed_step), shared by
    its sequence lengths; one arm per (length, variant). Also {variant: (model, as it runs, optimizer)}."""
    steps = {
        variant: build_step(model, replace(train, compile=compile), precision, ops, batch=1)
        for variant, (model, train) in runs.items()
    }
    generator = torch.Generator().manual_seed(0)
    arms = []
    for n in seq_lens:
        for variant, (config, _) in runs.items():
            batch = batch_size or max(1, tokens_per_step // n)
            tokens = torch.randint(0, config.vocab_size, (batch, n + 1), generator=generator).to(ops.device)
            flops = model_cost(config, n).fwd_flops_per_token
            arms.append(Arm(variant, n, replace(steps[variant], tokens=tokens), flops))
    models = {
        v: (getattr(step.model, "_orig_mod", step.model), step.model, step.optimizer)
        for v, step in steps.items()
    }
    return arms, models


def measure(
    arms: list[Arm],
    rounds: int,
    dtypes: list[torch.dtype],
    ops: DeviceOps,
    say: Callable[[str], None],
    *,
    retries: int,
    peak_budget_s: float,
    peak_max_size: int,
) -> tuple[dict[torch.dtype, float], int]:
    """Warm every arm up, then time `rounds` interleaved rounds (each with a matmul peak per dtype) and
    every arm's memory peak; returns the peaks and how many timings were taken again (disturbed)."""
    if not peak_budget_s > 0 or peak_max_size < 1:
        raise UserError(
            f"peak_budget_s, peak_max_size: expected positive, got {peak_budget_s}, {peak_max_size}"
        )
    progress = Progress(arms, rounds, ops.now, say)
    for i, arm in enumerate(arms):  # warm-up: allocator, kernels' first calls (and compilation)
        start = ops.now()
        with StillRunning(say, f"warm-up {i + 1}/{len(arms)}: {arm.variant} seq_len {arm.seq_len}"):
            train_step(arm)
            forward_step(arm)
        progress.warmed_up(arm, ops.now() - start)
    peaks: dict[torch.dtype, float] = {}
    repeated = 0
    for k in range(rounds):
        for dtype in dtypes:
            peak = matmul_peak(dtype, ops, budget_s=peak_budget_s, max_size=peak_max_size)
            peaks[dtype] = max(peaks.get(dtype, 0.0), peak)
        for arm in arms:
            start = ops.now()
            beat = StillRunning(say, f"{arm.variant} seq_len {arm.seq_len} round {k + 1}/{rounds}")
            with beat:
                (total, optimizer), again = undisturbed(lambda a=arm: train_step(a), retries)
            arm.train_s.append(total)
            arm.opt_s.append(optimizer)
            with beat:
                fwd, again_fwd = undisturbed(lambda a=arm: timed(forward_step, a), retries)
            arm.fwd_s.append(fwd)
            repeated += again + again_fwd
            progress.timed(arm, k, ops.now() - start, len(dtypes) * peak_budget_s)
    for i, arm in enumerate(arms):
        arm.peak_bytes = ops.peak_bytes(lambda a=arm: train_step(a))
        say(
            f"[bench] peak memory {i + 1}/{len(arms)}: {arm.variant} seq_len {arm.seq_len}, "
            f"{arm.peak_bytes / 2**20:,.0f} MB"
        )
    return peaks, repeated


# --- progress ------------------------------------------------------------------------------------------


def printer(echo: bool) -> Callable[[str], None]:
    def say(line: str) -> None:
        if echo:
            print(line, flush=True)  # flushed: a person (or a log file) sees each line as it happens

    return say


class StillRunning(contextlib.AbstractContextManager):
    """While the body runs, a line every `every` seconds (`[bench] what: still running, 62 s`): one step of
    a big model on a slow CPU (float32 on AVX2 took 34 s) must not leave a person without a sign of life.
    A thread waiting on an event: it wakes only to print, so it does not disturb the timings. Reusable."""

    def __init__(self, say: Callable[[str], None], what: str, every: float = 25.0):
        self.say, self.what, self.every = say, what, every
        self.started = time.monotonic()

    def __enter__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            self.say(f"[bench] {self.what}: still running, {time.monotonic() - self.started:.0f} s")

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class Progress:
    """One line per arm and round: what was timed, its tokens/s so far, and the time left, estimated
    from each arm's last measured time (its warm-up before the first round)."""

    def __init__(self, arms: list[Arm], rounds: int, clock: Callable[[], float], say: Callable[[str], None]):
        self.arms, self.rounds, self.clock, self.say = arms, rounds, clock, say
        self.cost = [0.0] * len(arms)  # seconds of each arm's last measurement (train + forward)

    def warmed_up(self, arm: Arm, seconds: float) -> None:
        i = self.arms.index(arm)
        self.cost[i] = seconds
        self.say(
            f"[bench] warm-up {i + 1}/{len(self.arms)}: {arm.variant} seq_len {arm.seq_len}, {seconds:.1f} s"
        )

    def timed(self, arm: Arm, round_index: int, seconds: float, peak_s: float) -> None:

        i = self.arms.index(arm)
        self.cost[i] = seconds
        later_rounds = self.rounds - 1 - round_index
        left = sum(self.cost[i + 1 :]) + later_rounds * (sum(self.cost) + peak_s) + sum(self.cost) / 2
        train = arm.n_tokens / statistics.median(arm.train_s)
        fwd = arm.n_tokens / statistics.median(arm.fwd_s)
        self.say(
            f"[bench] {arm.variant} seq_len {arm.seq_len} round {round_index + 1}/{self.rounds}: "
            f"train {train:,.0f} tok/s, fwd {fwd:,.0f} tok/s (medians so far); about {format_seconds(left)} left"
        )


# --- measurements ------------------------------------------------------------------------------------


def train_step(arm: Arm) -> tuple[float, float]:
    """One training step of the arm's run (ablate.train.choices.timed_step); returns (seconds of the whole step,
    seconds of its optimizer part)."""
    return timed_step.train_step(arm.step)


def forward_step(arm: Arm) -> None:
    timed_step.forward_step(arm.step)


def undisturbed(measure, retries: int):
    """`measure()`, repeated (up to `retries` times) while other processes took more than `DISTURBED` of
    the CPU during it: with two cores, one busy neighbour stalls every OpenMP barrier. Returns the last
    result and how many times it was repeated."""
    repeats = -1
    while True:
        foreign = ForeignCpu()
        result = measure()
        repeats += 1
        if foreign.fraction() <= DISTURBED or repeats >= retries:
            return result, repeats


def timed(step, arm: Arm) -> float:
    start = arm.step.ops.now()
    step(arm)
    return arm.step.ops.now() - start


def matmul_peak(
    dtype: torch.dtype,
    ops: DeviceOps | None = None,
    *,
    budget_s: float = PEAK_BUDGET_S,
    max_size: int = PEAK_MAX_SIZE,
    start_size: int = 128,
    longest_product_s: float = 0.2,
) -> float:
    """Best FLOP/s of square `dtype` GEMMs on `ops.device`, bounded in time on any device: sizes double
    from `start_size` while the next size's product (8x the FLOPs) is predicted to take under
    `longest_product_s`, up to `max_size`, and no new size or repetition starts after `budget_s`. Each
    size is timed over repeated products for about a tenth of the budget (at least one)."""
    ops = ops or CpuOps()
    deadline = ops.now() + budget_s
    best, size = 0.0, min(start_size, max_size)
    while True:
        a = torch.randn(size, size, device=ops.device).to(dtype)
        b = torch.randn(size, size, device=ops.device).to(dtype)
        torch.mm(a, b)  # warm-up
        reps, began = 0, ops.now()
        while True:
            torch.mm(a, b)
            reps += 1
            now = ops.now()
            if now - began >= budget_s / 10 or now >= deadline:
                break
        per_product = max(now - began, 1e-9) / reps
        best = max(best, 2 * size**3 / per_product)
        if 2 * size > max_size or 8 * per_product > longest_product_s or now >= deadline:
            return best
        size *= 2
