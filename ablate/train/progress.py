"""A training run's progress line, in the units a person plans with: optimizer steps of the total.

    train 120/240 steps  0.98M/1.97M tokens  loss 4.512  val 4.630  8.1K tok/s  elapsed 2:01  ETA 2:01

Lightning's default bar counts micro-batches of an epoch it cannot size (`Epoch 0: | 119/? [01:08<00:00,
1.74it/s]`). This one counts optimizer steps against `max_steps` (a resumed run starts at its checkpoint's
step), shows the tokens seen, the last optimizer step's training loss (mean over its micro-batches, as
logged), the last validation loss, the throughput of this process since it started (validation time
included, so the ETA holds) and the time left at that rate. Validation has no bar of its own. A compiled
model (`train.compile`) adds the time spent compiling so far (`compile 0:42`), which the rate leaves out.

On a terminal the line is redrawn in place (at most every `refresh_seconds`); into a file or a pipe
(sweep workers, CI logs) it is printed as a whole line every `log_seconds` and once at the end.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import lightning.pytorch as L
from lightning.pytorch.callbacks import ProgressBar

from ablate.core.tables import si


def format_duration(seconds: float) -> str:
    """125 -> '2:05', 3725 -> '1:02:05'; '?' when unknown."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def progress_line(
    step: int,
    total: int,
    batch_tokens: int,
    loss: float,
    val_loss: float,
    tokens_per_s: float,
    elapsed: float,
    compile_seconds: float = 0.0,
) -> str:
    """The progress line of the module doc (pure: the callback only gathers its numbers)."""
    parts = [
        f"train {step}/{total} steps",
        f"{si(step * batch_tokens)}/{si(total * batch_tokens)} tokens",
        f"loss {loss:.3f}" if math.isfinite(loss) else "loss -",
    ]
    if math.isfinite(val_loss):
        parts.append(f"val {val_loss:.3f}")
    rate_ok = math.isfinite(tokens_per_s) and tokens_per_s > 0
    parts.append(f"{si(tokens_per_s)} tok/s" if rate_ok else "- tok/s")
    eta = (total - step) * batch_tokens / tokens_per_s if rate_ok else math.nan
    parts += [f"elapsed {format_duration(elapsed)}", f"ETA {format_duration(eta)}"]
    if compile_seconds > 0:
        parts.append(f"compile {format_duration(compile_seconds)}")
    return "  ".join(parts)


class StepProgress(ProgressBar):
    """The progress line of the module doc, as Lightning's progress bar callback (rank 0 only)."""

    def __init__(
        self,
        batch_tokens: int,
        stream: TextIO | None = None,
        refresh_seconds: float = 0.5,
        log_seconds: float = 30.0,
        compile_clock: Callable[[], float] | None = None,
    ) -> None:
        """`compile_clock`: seconds spent compiling in this process so far (a compiled model), else None."""
        super().__init__()
        self.compile_clock = compile_clock
        self._compiled_before = 0.0
        self.batch_tokens = batch_tokens
        self.stream = stream
        self.refresh_seconds, self.log_seconds = refresh_seconds, log_seconds
        self._enabled = True
        self._micro: list[Any] = []  # this optimizer step's micro-batch losses (tensors: no sync per batch)
        self._loss = math.nan
        self._start = (0.0, 0)  # (clock, step) when this process started training
        self._shown = -math.inf
        self._width = 0
        self._pending: list[Any] = []  # the last completed step's micro-batch losses

    # --- Lightning's ProgressBar interface -----------------------------------------------------------
    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    # --- hooks ---------------------------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = (time.perf_counter(), trainer.global_step)
        self._compiled_before = self.compile_clock() if self.compile_clock else 0.0

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self._micro.append(loss.detach())
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # mid-accumulation: no optimizer step yet
        now = time.perf_counter()
        final = trainer.global_step >= trainer.max_steps
        if self._micro:
            # Lightning hands on each micro-batch's loss divided by the accumulation count (what is
            # back-propagated): their sum is the mean over the step's micro-batches.
            self._pending = self._micro
        self._micro = []
        interval = self.refresh_seconds if self._tty else self.log_seconds
        if final or now - self._shown >= interval:
            self._loss = float(sum(float(x) for x in self._pending))
            if self._tty or not final:  # a log gets its last line at the end, with the last validation
                self._show(trainer, now)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit" and self._tty:
            self._show(trainer, time.perf_counter())  # the new val loss, at once on a terminal

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._show(trainer, time.perf_counter(), end=True)

    # --- drawing -------------------------------------------------------------------------------------
    @property
    def _out(self) -> TextIO:
        return self.stream or sys.stdout

    @property
    def _tty(self) -> bool:
        isatty = getattr(self._out, "isatty", None)
        return bool(isatty and isatty())

    def line(self, trainer: L.Trainer, now: float) -> str:
        start_clock, start_step = self._start
        elapsed = now - start_clock
        compiling = self.compile_clock() - self._compiled_before if self.compile_clock else 0.0
        done = trainer.global_step - start_step
        training = elapsed - compiling
        rate = done * self.batch_tokens / training if done > 0 and training > 0 else math.nan
        val = trainer.callback_metrics.get("val/loss")
        return progress_line(
            trainer.global_step,
            trainer.max_steps,
            self.batch_tokens,
            self._loss,
            float(val) if val is not None else math.nan,
            rate,
            elapsed,
            compiling,
        )

    def _show(self, trainer: L.Trainer, now: float, end: bool = False) -> None:
        if not self._enabled:
            return
        text = self.line(trainer, now)
        self._shown = now
        if self._tty:
            pad = " " * max(0, self._width - len(text))
            self._width = len(text)
            self._out.write("\r" + text + pad + ("\n" if end else ""))
        else:
            self._out.write(text + "\n")
        self._out.flush()
